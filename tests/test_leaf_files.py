"""The flat files trial inputs and outputs cross processes in (evaluate/leaf_files.py)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch

from pike.evaluate.leaf_files import MAGIC, LeafFileError, read_leaves, write_leaves


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor)
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x.cpu(), y.cpu())
        elif isinstance(x, float) and math.isnan(x):
            assert isinstance(y, float) and math.isnan(y)
        else:
            assert x == y and type(x) is type(y)


LEAVES = [
    torch.randn(3, 5), torch.arange(7, dtype=torch.int64), torch.ones(2, dtype=torch.bfloat16),
    torch.tensor([True, False]), torch.tensor(2.5), torch.zeros(0, 4),
    torch.randn(4, 6)[:, ::2],  # not contiguous
    torch.randn(3, dtype=torch.complex64),
    torch.randn(3, dtype=torch.complex64).conj(), -torch.randn(2, dtype=torch.complex64).conj(),
    3, 2.5, float("inf"), float("nan"), None, True, "text",
]


@pytest.mark.parametrize("trusted", [False, True])
def test_leaves_come_back_as_written(tmp_path: Path, trusted: bool) -> None:
    path = tmp_path / "out.pt"
    write_leaves(LEAVES, path)
    assert path.read_bytes()[:8] == MAGIC
    _same(LEAVES, read_leaves(path, trusted=trusted))


def test_what_the_format_cannot_hold_goes_through_torch_save(tmp_path: Path) -> None:
    nested = [torch.ones(2), [torch.zeros(1), 4], {"k": 1}]  # inputs may hold lists
    path = tmp_path / "in.pt"
    write_leaves(nested, path)
    assert path.read_bytes()[:8] != MAGIC
    back = read_leaves(path)
    assert torch.equal(back[0], nested[0]) and back[1][1] == 4 and back[2] == {"k": 1}


def _forge(path: Path, header: dict, body: bytes = b"") -> None:
    text = json.dumps(header).encode()
    start = (16 + len(text) + 63) // 64 * 64
    raw = struct.pack("<8sQ", MAGIC, len(text)) + text
    path.write_bytes(raw + b"\0" * (start - len(raw)) + body)


@pytest.mark.parametrize("header", [
    {"leaves": [{"dtype": "float32", "shape": [1000], "offset": 0, "nbytes": 4000}]},  # past end
    {"leaves": [{"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 8}]},  # size lies
    {"leaves": [{"dtype": "float32", "shape": [2], "offset": 3, "nbytes": 8}]},  # misaligned
    {"leaves": [{"dtype": "Tensor", "shape": [2], "offset": 0, "nbytes": 8}]},  # no dtype
    {"leaves": [{"dtype": "float32", "shape": [-2], "offset": 0, "nbytes": 8}]},
    {"leaves": [{"dtype": "float32", "shape": [2.0], "offset": 0, "nbytes": 8}]},
    {"leaves": [{"value": {"a": 1}}]},  # not a scalar
    {"leaves": [{"float": "1e999"}]},
    {"leaves": "all"},
    {"leaves": [{"dtype": "bits8", "shape": [8], "offset": 0, "nbytes": 8}]},  # not comparable
    {"leaves": [{"dtype": "float32", "shape": [1] * 65, "offset": 0, "nbytes": 4}]},
    {"leaves": [{"dtype": "float32", "shape": [8], "offset": 0, "nbytes": 32},  # partly shared
                {"dtype": "float32", "shape": [16], "offset": 0, "nbytes": 64}]},
    {"leaves": [{"dtype": "float32", "shape": [16], "offset": 0, "nbytes": 64}] * 50},  # one region, many times
    {"other": []},
])
def test_a_forged_header_is_refused_not_trusted(tmp_path: Path, header: dict) -> None:
    path = tmp_path / "outputs_0.pt"
    _forge(path, header, body=b"\0" * 64)
    with pytest.raises(LeafFileError):
        read_leaves(path)


def test_a_header_longer_than_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "outputs_0.pt"
    path.write_bytes(struct.pack("<8sQ", MAGIC, 1 << 40) + b"{}")
    with pytest.raises(LeafFileError):
        read_leaves(path)


def test_a_file_read_whole_is_the_readers_own_copy(tmp_path: Path) -> None:
    """A candidate's file is read into the parent's memory: changing or truncating the
    file afterwards changes nothing the parent holds (a mapping would, or end it)."""
    path = tmp_path / "outputs_0.pt"
    write_leaves([torch.ones(1024)], path)
    back = read_leaves(path)
    path.write_bytes(b"")
    assert float(back[0].sum()) == 1024


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_tensors_are_written_and_read_straight_to_the_device(tmp_path: Path) -> None:
    leaves = [torch.randn(1 << 20, device="cuda"), torch.arange(5, device="cuda"), 7]
    path = tmp_path / "out.pt"
    write_leaves(leaves, path)
    back = read_leaves(path, device=torch.device("cuda"))
    assert back[0].device.type == "cuda"
    _same(leaves, back)


def test_a_sparse_file_cannot_make_the_reader_allocate_its_size(tmp_path: Path) -> None:
    # A candidate can set its file's size to anything (ftruncate): only the tensors'
    # bytes are read, and the expected size bounds those.
    path = tmp_path / "outputs_0.pt"
    write_leaves([torch.ones(4)], path)
    with open(path, "r+b") as f:
        f.truncate(2 << 30)
    _same(read_leaves(path, max_bytes=1024), [torch.ones(4)])
    big = tmp_path / "outputs_1.pt"
    _forge(big, {"leaves": [{"dtype": "float32", "shape": [1 << 28], "offset": 0,
                             "nbytes": 1 << 30}]})
    with open(big, "r+b") as f:
        f.truncate(2 << 30)
    with pytest.raises(LeafFileError, match="more than"):
        read_leaves(big, max_bytes=1 << 20)


def test_dtypes_no_comparison_supports_go_through_torch_save(tmp_path: Path) -> None:
    path = tmp_path / "out.pt"
    odd = torch.zeros(4, dtype=torch.uint8).view(torch.bits8)
    write_leaves([odd], path)
    assert path.read_bytes()[:len(MAGIC)] != MAGIC
    assert read_leaves(path)[0].dtype == torch.bits8


def test_outputs_of_a_dtype_torch_cannot_compare_are_not_the_same() -> None:
    from pike.evaluate.trial_comparison import _same_leaves
    odd = torch.zeros(4, dtype=torch.uint8).view(torch.bits8)
    assert not _same_leaves([odd], [odd.clone()])
    assert _same_leaves([torch.ones(3)], [torch.ones(3)])


def test_a_trials_outputs_are_kept_in_short_to_tell_repeats() -> None:
    # the check keeps the first trial's outputs only to name a repeated answer in its
    # message: a fingerprint of a few thousand values, not a gigabyte on the GPU
    from pike.evaluate.trial_comparison import _PRINTED_VALUES, _fingerprint, _same_print
    big = torch.randn(300, 200)
    shapes, values = _fingerprint([big, 2.0])
    assert shapes == [(300, 200), None] and values[0].numel() == _PRINTED_VALUES
    assert _same_print(_fingerprint([big]), _fingerprint([big.clone()]))
    assert not _same_print(_fingerprint([big]), _fingerprint([big.reshape(200, 300)]))
    assert not _same_print(_fingerprint([big]), _fingerprint([big + 1]))
    small = torch.randn(7)
    changed = small.clone()
    changed[3] += 1  # every value of a small output counts
    assert not _same_print(_fingerprint([small]), _fingerprint([changed]))
    assert not _same_print(_fingerprint([2.0]), _fingerprint([2.0]))  # as before: tensors only


def test_a_fingerprint_of_a_large_output_stays_inside_it() -> None:
    # float32 positions rounded past the end of outputs above 2**24 elements
    from pike.evaluate.trial_comparison import _PRINTED_VALUES, _fingerprint, _same_print
    big = torch.zeros(2**25 + 3, dtype=torch.uint8)
    big[-1] = 7
    printed = _fingerprint([big])
    assert printed is not None and printed[1][0].numel() == _PRINTED_VALUES
    assert printed[1][0][-1] == 7  # the last position is the last element
    assert _same_print(printed, _fingerprint([big.clone()]))


def test_a_dtype_that_cannot_be_indexed_has_no_fingerprint() -> None:
    from pike.evaluate.trial_comparison import _fingerprint, _same_print
    odd = torch.zeros(5000, dtype=torch.uint8).view(torch.bits8)
    assert _fingerprint([odd]) is None
    assert not _same_print(_fingerprint([odd]), _fingerprint([odd]))


def test_calibration_stand_ins_take_a_plain_dtype() -> None:
    from pike.evaluate.timed_calls import _sample_leaf, stand_in

    quantized = torch.quantize_per_tensor(torch.ones(3, 4), 0.1, 0, torch.quint8)
    for leaf in (quantized, torch.ones(3, 4, dtype=torch.bfloat16), torch.tensor(1.0)):
        small = stand_in(leaf)
        assert small.dim() == leaf.dim() and small.device == leaf.device
        _sample_leaf(small, 16)  # what the calibration does with it
    assert stand_in(2.5) == 2.5


def test_a_file_written_in_place_keeps_its_pages_and_holds_only_the_new_leaves(
        tmp_path: Path) -> None:
    """The child writes a trial's outputs over a file the parent passed on: the same file
    (its pages reused), and nothing of the old leaves left in it or read back."""
    path, fresh = tmp_path / "out.pt", tmp_path / "fresh.pt"
    write_leaves([torch.randn(64, 64), torch.randn(300), "old"], path)
    inode = path.stat().st_ino
    new = [torch.randn(8, 8), 7]
    write_leaves(new, path, in_place=True)
    write_leaves(new, fresh)
    assert path.stat().st_ino == inode
    assert path.read_bytes() == fresh.read_bytes()
    _same(new, read_leaves(path))


def test_a_candidates_file_is_read_only_as_the_one_name_of_a_regular_file(
        tmp_path: Path) -> None:
    """A candidate writes its outputs folder: a symbolic or hard link to a file of the
    parent (the reference's outputs) would be read as its answer, a FIFO would block the
    reader. Each is refused, at once; the parent's own (trusted) files read as before."""
    import os

    answers = tmp_path / "expected.pt"
    write_leaves(LEAVES, answers)
    (tmp_path / "symlink.pt").symlink_to(answers)
    os.link(answers, tmp_path / "hardlink.pt")
    os.mkfifo(tmp_path / "fifo.pt")
    (tmp_path / "folder.pt").mkdir()
    for name, words in [("symlink.pt", "symbolic link"), ("hardlink.pt", "another name"),
                        ("fifo.pt", "not a regular file"), ("folder.pt", "not a regular")]:
        with pytest.raises(LeafFileError, match=words):
            read_leaves(tmp_path / name)
    _same(LEAVES, read_leaves(answers, trusted=True))
    (tmp_path / "hardlink.pt").unlink()
    _same(LEAVES, read_leaves(answers))  # one name again


def test_the_child_does_not_write_its_outputs_through_a_link_it_planted(
        tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    (tmp_path / "outputs_2.pt").symlink_to(target)
    with pytest.raises(OSError):
        write_leaves([torch.ones(3)], tmp_path / "outputs_2.pt", in_place=True)
    assert target.read_text() == "keep"
