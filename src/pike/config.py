"""Run configuration: one pydantic model, loadable from YAML, every default documented here."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pike.errors import ConfigError

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")


def autotunes(mode: str) -> bool:
    """Whether a torch.compile mode's build benchmarks kernels (and so holds the device
    alone): max-autotune, with or without CUDA graphs."""
    return "max-autotune" in mode


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TimingConfig(_Strict):
    """How each module is timed (same protocol for reference and candidate)."""

    warmup_calls: int = Field(3, ge=1, description="calls before timing starts (at least)")
    warmup_seconds: float = Field(0.1, ge=0, description="keep warming up until this long")
    min_calls: int = Field(20, ge=1, description="timed calls (at least)")
    max_calls: int = Field(
        5000, ge=1, description="timed calls (at most); 1000 would save about 2 s on a "
        "0.1 ms task with no less steady speedups (bench/results/evaluation-noise-h100-"
        "max-calls.md), but leaves the reuse and timed-output guards too few calls to "
        "catch a candidate that answers in microseconds")
    min_seconds: float = Field(1.0, ge=0, description="keep timing until this much timed run time")
    rounds: int = Field(
        20, ge=1, description="split the timed calls into this many blocks, alternating with the "
        "reference's blocks, so both see the same state of the host")
    flush_l2: bool = Field(True, description="overwrite a buffer larger than L2 before each CUDA call")
    max_reference_drift: float | None = Field(
        0.05, gt=0, description="on CUDA: a timing window whose reference median is off the "
        "median of the run's earlier windows by more than this share is timed again (up to "
        "three times, the last with a fresh reference child); still off, the verdict is `noisy` and no search takes it as its best. "
        "None: off (CPU timings on a shared host drift more than this and are not checked)")
    give_up_slower_than: float | None = Field(
        3.0, gt=1, description="on a GPU, a candidate whose fastest call is this many times "
        "the reference's median after the window's first three rounds and eight calls (the "
        "reuse check's) is timed no further, and its verdict says after how "
        "many rounds (`timed_rounds`): no search takes it, and on an H200 level2 bench one "
        "such candidate (bf16 Conv3d, seconds a call) held the device alone for 190 s while "
        "every other evaluation stood still. None: every round, however slow")
    give_up_behind_best: float | None = Field(
        1.25, gt=1, description="on a GPU, in a search (offline or LLM): a candidate whose "
        "fastest call, after the window's first three rounds and eight calls, puts it this "
        "many times behind the search's best so far is timed no further (`timed_rounds`, "
        "`behind_best`): it cannot be the best, and the searches' windows stood every other "
        "evaluation still for 45% of its time on an H200 level2 bench. 1.25 leaves out what "
        "search.confirm_within (0.2) would not time again; search.bar_rank says which best "
        "figure is the bar. None: every round")
    share_window: int = Field(
        4, ge=1, description="candidates of one task that wait for the device at once are "
        "timed in one window, at most this many beside one eager, each against eager as in "
        "a window of its own and each stopped while the others are timed; on an H200 "
        "level2 bench the candidates' exclusive windows stopped every other evaluation for "
        "44% of its time. 1: every candidate in a window of its own")
    input_sets: int = Field(
        3, ge=2, description="timed calls rotate over this many input sets, drawn apart from "
        "the trials' and staged only when timing starts; a random sample of timed calls has "
        "its outputs compared with the reference's for the same inputs")


class LimitsConfig(_Strict):
    """Wall-clock limits per phase (seconds), the memory limit of the child process tree and
    the disk limit of a candidate's files."""

    load_seconds: float = Field(600, gt=0, description="import the module, build extensions, construct")
    check_seconds: float = Field(300, gt=0, description="all correctness trials")
    timing_seconds: float = Field(300, gt=0, description="warm-up and timed calls")
    build_seconds: float = Field(
        300, gt=0, description="a baseline's torch.compile mode: its build (max-autotune's "
        "autotuning too), warm-up and check against eager, before the timed window; a mode "
        "past it fails alone. max-autotune on a large CNN took longer than 300 s on an H200. "
        "Also the limit of a candidate's first call where its file uses torch.compile or "
        "Triton, which build there")
    fitted: bool = Field(
        True, description="a candidate's check and timing limits follow the reference's own "
        "check time (50x it, at least 30 s; the values above stay ceilings), so a hung "
        "candidate on a small task is judged within a minute. The first call of a candidate "
        "that uses torch.compile or Triton, where they build, has at least build_seconds")
    memory_gib: float | None = Field(
        None, gt=0, description="host RSS of the whole child tree; None = 75% of physical memory"
    )
    disk_gib: float | None = Field(
        None, gt=0, description="what a candidate's child may write: its folders and printed "
        "output together, and any one file (RLIMIT_FSIZE); None = 8 GiB plus four times one "
        "trial's outputs of the reference. A candidate past it is ended ('crashed')")
    build_cache_gib: float | None = Field(
        32, gt=0, description="the candidates' shared build cache (extensions, Triton's and "
        "inductor's kernels) as a whole: past it, the entries written longest ago (none of "
        "the last hour) are removed after an evaluation, down to 3/4 of it; None = no bound")


# Where both models of an evaluation are built (EvalConfig.construct_on).
ConstructOn = Literal["auto", "cpu", "device"]
CONSTRUCT_ON: tuple[str, ...] = get_args(ConstructOn)
# construct_on 'auto' builds a task on the GPU from this many bytes of weights and buffers:
# a level2 task's 4 GiB nn.Linear took every candidate 33 to 50 s to build on the CPU and
# move, beside other evaluations on an H200, and milliseconds on the GPU.
BUILD_ON_DEVICE_BYTES = 256 * 2**20


class EvalConfig(_Strict):
    """The evaluator protocol (DESIGN.md); defaults follow KernelBench/PIKE."""

    device: str | None = Field(None, description="'cpu', 'cuda', 'cuda:1'; None = cuda:0 if present")
    trials: int = Field(5, ge=1, description="correctness trials, each with fresh inputs")
    seed: int | None = Field(
        None, description="None: the weights' and every input's seed, and the other "
        "distribution's transform, are drawn from the OS's randomness for each reference "
        "run and never shown to candidates; an int fixes them all (reproducible, but "
        "predictable: for debugging, not for judging untrusted code)")
    atol: float = Field(1e-2, ge=0, description="absolute tolerance: each output value may "
                        "differ from the reference's by atol + rtol * |reference value|")
    rtol: float = Field(1e-2, ge=0, description="relative tolerance (see atol)")
    model_mode: Literal["as_constructed", "eval"] = Field(
        "as_constructed", description="call .eval() on both models, or leave them as built"
    )
    construct_on: ConstructOn = Field(
        "auto", description="where both models are built: 'cpu' and then moved (KernelBench), "
        "or 'device', under torch.device, for tasks written to be built on the GPU (big "
        "weights, a prefill in the constructor); 'auto': on the GPU where the task's weights "
        "and buffers (counted on the meta device) reach 256 MiB, else on the CPU. Weights "
        "still match, as both sides build alike")
    timing: TimingConfig = Field(default_factory=TimingConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    sandbox: Literal["auto", "required", "off"] = Field(
        "auto", description="run every evaluation child in an OS sandbox (bubblewrap: own "
        "PID, network, IPC and mount namespaces, a read-only view of the system, dies with "
        "pike): 'auto' where bwrap works (one warning where not), 'required' to refuse to "
        "run without it, 'off' for the in-process guards only")
    network_isolation: Literal["auto", "namespace", "off"] = Field(
        "auto", description="run children in a network namespace with no interfaces: 'auto' "
        "where the kernel allows it (with a warning where not), 'namespace' to require it")
    guards: bool = Field(
        True, description="anti-cheating guards (audit hook, integrity and wall-clock checks, "
        "the shifted and after-timing trials); turn off only to measure their cost")
    profile: bool = Field(False, description="after the checks, profile correct candidates "
                          "(torch.profiler, outside the timed region) for prompts and users")
    profile_calls: int = Field(10, ge=1, description="forward calls in the profiling pass")
    ncu: bool = Field(False, description="with profile, on CUDA: Nsight Compute metrics "
                      "(achieved occupancy, DRAM and SM throughput) of the top kernels where "
                      "`ncu` is installed; a one-line note where it is not")
    profile_tokens: int = Field(300, ge=50, description="how long a profile may be in a prompt")
    workers: int = Field(1, ge=1, description="evaluations at once: their builds and "
                         "compiles overlap, timing stays one at a time per GPU")
    devices: list[str] = Field(default_factory=list, description="GPUs of this host to "
                               "spread evaluations over, one timing lane each "
                               "(e.g. [cuda:0, cuda:1]); empty = `device`")
    cluster: Literal["local", "ray"] = Field(
        "local", description="'ray': one evaluation actor per GPU of a Ray cluster")
    ray_address: str | None = Field(None, description="the Ray cluster to join (None = "
                                    "RAY_ADDRESS, or a local Ray started for the run)")
    timing_cores: int = Field(2, ge=0, description="on a GPU host with cores to spare, CPU "
                              "cores kept per GPU for the timed children while builds use the "
                              "rest (host-bound timings stay clean under compile load); 0 = off")
    compile_threads: int = Field(1, ge=1, description="torch.compile's compile workers in "
                                 "each evaluation child; more compile large models faster "
                                 "(at 1, large CNNs took over 300 s in a compile mode), and "
                                 "the child shuts them down before it ends")
    warm_up: bool = Field(True, description="call a candidate once on the first trial's "
                          "inputs before its trials: lazy compiles (Triton, torch.compile) "
                          "and autotuning happen there, like the trials out of other evaluations' "
                          "timed windows, and a failure there is a check-phase verdict")
    device_lock: Literal["pause_others", "every_gpu_use", "timing_only"] = Field(
        "pause_others", description="pause_others: timing holds the device alone and stops "
        "(SIGSTOP) every other candidate's child for its window, whatever that child is "
        "doing (a compile, trials, a thread it left running), then lets it go on; the "
        "parent's comparisons and the reference children hold the device shared. "
        "every_gpu_use: a child's start, load, builds, warm-up and trials hold the device "
        "shared instead, so a timer waits for every compile on the card to end. "
        "timing_only: only timing is locked; for measuring what the lock buys "
        "(bench/contamination.py), since neighbours' compiles and trials can then slow a "
        "window")
    time_candidate: bool = Field(True, description="skip timing to only check correctness")
    prebuild_autotune: Literal["auto", "on", "off"] = Field(
        "auto", description="a baseline's autotuning torch.compile mode (max-autotune) "
        "built once beside other evaluations first, its autotuning choices and compiled "
        "graph thrown away: its own build, which holds the device alone and stops every "
        "other evaluation, then finds its kernels compiled and mostly measures them. "
        "auto: on where other work shares the GPU with a task's baselines (pike bench, "
        "whose searches run beside them; pike audit with more tasks at once than GPUs), "
        "off where a task has the GPU to itself (nobody waits for its build, and the "
        "second build's tracing would only add time) and on the CPU (no device lock: "
        "nothing waits there)")
    build_cache: Path | None = Field(
        None, description="where compiled extensions and inductor's and Triton's caches are "
        "kept: candidates/ in it for candidates, the folder's name plus -reference beside it "
        "for the reference; None = ~/.cache/pike/build"
    )


class LLMConfig(_Strict):
    """Which models the agents use and how they are called."""

    model: str | None = Field(None, description="optimizer and brainstormer: openai:gpt-5, "
                              "gemini:..., openrouter:..., http://host:port/v1#model")
    fixer: str | None = Field(None, description="error fixer (a cheaper model); None = model")
    max_concurrency: int = Field(4, ge=1, description="LLM calls in flight at once")
    timeout_s: float = Field(300.0, gt=0, description="per call")
    max_retries: int = Field(5, ge=0, description="on 429, 5xx and timeouts, with backoff")
    retry_wait_s: float = Field(2.0, ge=0, description="first backoff wait")
    temperature: float | None = Field(None, description="None = the provider's default")
    max_tokens: int | None = Field(None, ge=1, description="None = the provider's default")
    prompt_tokens: int | None = Field(
        12000, ge=0, description="each prompt's budget in estimated tokens (4 characters "
        "each): parts are kept by priority (task, parent, plan step, profile, top programs, "
        "recent errors) and the lowest trimmed or dropped to fit; the task is never cut; "
        "None or 0 = no limit")
    pricing: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="model -> {input_per_mtok, output_per_mtok} in USD, "
        "over the packaged table")


class BranchingConfig(_Strict):
    """PIKE-B, the exploit-heavy branching search; defaults are the paper's."""

    branches: int = Field(10, ge=1, description="optimizer queries per round")
    max_fix_attempts: int = Field(5, ge=0, description="error-fixer queries per failing branch")
    top_k: int = Field(4, ge=1, description="seeds of the next round")
    brainstorm: bool = Field(True, description="round 0 starts from the brainstormer's ideas")


class OfflineConfig(_Strict):
    """The offline strategy: program transformations, no LLM."""

    max_candidates: int = Field(24, ge=1, description="transformation sets judged at most")
    max_seconds: float = Field(
        900.0, gt=0, description="the search's budget in seconds its evaluation lanes ran: "
        "wall-clock time less the time its evaluations stood stopped by timing windows "
        "(other tasks', and with several workers its own others') or waited for others (a "
        "device held alone, host memory, the task's reference run, room in the pool after a "
        "GPU out of memory, and such a crowded first try), each one's shared among the "
        "search's evaluations beside it (one alone stood the search still for all of it); "
        "candidates started within it are judged to the end")


class EvolveConfig(_Strict):
    """PIKE-O, island-based evolution in the style of OpenEvolve (presets: search/presets.py)."""

    islands: int = Field(3, ge=1, description="separate populations, ring migration")
    population_size: int = Field(50, ge=1, description="programs kept per island (best first)")
    archive_size: int = Field(20, ge=1, description="elites in the solution library")
    num_top_programs: int = Field(5, ge=0, description="library programs shown in a prompt")
    migration_interval: int = Field(5, ge=1, description="generations between migrations")
    migration_rate: float = Field(0.1, ge=0, le=1, description="share of an island's best "
                                  "copied to the next island")
    exploration_ratio: float = Field(0.5, ge=0, le=1, description="parent: a random program")
    exploitation_ratio: float = Field(0.3, ge=0, le=1, description="parent: a library elite")
    elite_selection_ratio: float = Field(0.1, ge=0, le=1, description="otherwise: one of this "
                                         "top share of the island")
    template: Literal["mutation", "crossover"] = Field(
        "crossover", description="one parent rewritten, or two parents combined")
    parallel_evaluations: int = Field(4, ge=1, description="candidates per generation")
    max_fix_attempts: int = Field(5, ge=0, description="error-fixer queries per failing one")
    seed: int = Field(0, description="parent selection is reproducible from this seed")


class SearchConfig(_Strict):
    """What a search may spend and what it may write."""

    budget_queries: int | None = Field(300, ge=1, description="LLM calls per task, all roles")
    budget_dollars: float | None = Field(None, gt=0, description="USD per task, all roles")
    backend: Literal["any", "cuda", "triton"] = Field(
        "any", description="what the optimizer may write: any, CUDA C++ or Triton kernels")
    strategy: Literal["branching", "evolve"] = Field(
        "branching", description="the LLM search: PIKE-B (branching) or PIKE-O (evolve). "
        "Without a model (llm.model unset) pike runs the offline strategy whatever this says; "
        "on the command line, --strategy offline asks for it by name")
    branching: BranchingConfig = Field(default_factory=BranchingConfig)
    evolve: EvolveConfig = Field(default_factory=EvolveConfig)
    offline: OfflineConfig = Field(default_factory=OfflineConfig)
    seed_offline: bool = Field(False, description="with an LLM: run the offline strategy "
                               "first and start the LLM search from its best candidate")
    seed_from: Path | None = Field(
        None, description="with an LLM: a solution set (folder of files matched to tasks by "
        "id, or one pike wrote with `pike export --set`); its correct files seed round 0")
    fix_seeds: bool = Field(False, description="with seed_from: hand the set's failing files "
                            "to the error fixer first; the repaired ones seed round 0 too")
    planner: bool = Field(False, description="a planner agent ranks concrete steps from the "
                          "current best (and its profile) before each round or generation; "
                          "its queries count in the budget")
    plan_granularity: Literal["one", "several", "free"] = Field(
        "one", description="what each optimizer query implements: one step, three, or the "
        "whole plan")
    confirm_top: int = Field(3, ge=0, description="at the end of a search, this many of "
                             "the best correct candidates and eager are timed again in one "
                             "exclusive window; the best and its figures come from there "
                             "(0: the search-time figures)")
    confirm_within: float = Field(
        0.2, ge=0, description="also confirm every correct candidate whose search-time "
        "speedup is within this share of the best's, up to confirm_max: a compiled "
        "candidate's figure moves by that much between compiles (max-autotune picked "
        "kernels 22% slower in a busy pool than alone, bench/results/contamination-h200-"
        "alone.md), so the search's fourth can be the fastest")
    bar_rank: int = Field(
        1, ge=1, description="which best search figure so far is the bar of "
        "eval.timing.give_up_behind_best: 1, the best. A candidate cut short behind it is "
        "not among the confirm_top the confirming window times again; of 174 confirming "
        "windows in the committed level2 runs, one winner would have been cut (32_Conv2d_"
        "Scaling_Min's autocast_fp16, 1.27x, where the 2.38x best failed in the window). "
        "Set it to confirm_top (3) to cut only what no confirming window takes: on the "
        "H200 level2 bench 6 windows (20 s) instead of 27 (98 s)")
    confirm_max: int = Field(6, ge=0, description="the most candidates one confirming "
                             "window takes (each is loaded and compiled again)")
    screen_seconds: float | None = Field(
        0.25, gt=0, description="with confirm_top > 0: a search's candidates are timed for "
        "this long in their own windows (eval.timing.min_seconds there), and the confirming "
        "window times the top ones for the full eval.timing.min_seconds, from which the best "
        "and its figures come. Every candidate's window stops all other evaluations on the "
        "GPU: on the H200 level2 bench they were the device's clock. With screen_rounds, a "
        "window of an identical candidate took 1.0 to 1.5 s alone on an H200 where 0.5 s in "
        "20 rounds took 1.75 to 2.4 s, and its figure stayed within 3.8% of 1.0 (bench/"
        "results/evaluation-noise-h200-screen.md), well inside confirm_within. None: the "
        "full protocol in every window")
    screen_rounds: int | None = Field(
        10, ge=1, description="with screen_seconds: the blocks each side of a search's "
        "window is timed in (eval.timing.rounds there); each block is a request to the "
        "child, and 10 blocks instead of 20 took 0.2 to 0.4 s (11 to 16%) off a 0.5 s "
        "screening window on an H200. None: eval.timing.rounds")
    baseline_modes: list[str] = Field(
        default_factory=lambda: ["eager", *(f"compile:{m}" for m in COMPILE_MODES)],
        description="what `pike bench` times once per task, for the report's comparisons")


class RunConfig(_Strict):
    """Everything a pike run can be told. Loaded from YAML, overridden by CLI flags."""

    eval: EvalConfig = Field(default_factory=EvalConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    runs_dir: Path = Field(Path("pike-runs"), description="where runs and baselines are written")

    def search_eval(self) -> EvalConfig:
        """The evaluator's config for a search's candidates: timed for
        `search.screen_seconds` in `search.screen_rounds` blocks (never more blocks than
        eval's) where a confirming window times its best again in full;
        `eval` itself otherwise (pike eval, pike audit, baselines and confirming windows
        always use `eval`)."""
        screen, rounds = self.search.screen_seconds, self.search.screen_rounds
        if (self.search.confirm_top == 0 or screen is None
                or screen >= self.eval.timing.min_seconds):
            return self.eval
        update: dict[str, float | int] = {"min_seconds": screen}
        if rounds is not None and rounds < self.eval.timing.rounds:
            update["rounds"] = rounds
        timing = self.eval.timing.model_copy(update=update)
        return self.eval.model_copy(update={"timing": timing})

    @classmethod
    def load(cls, path: Path | None) -> RunConfig:
        if path is None:
            return cls()
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"line {mark.line + 1}: " if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(f"{path}: not valid YAML ({where}{problem})") from None
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "top level"
            raise ConfigError(f"{path}: {where}: {first['msg']}") from None
