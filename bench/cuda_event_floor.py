"""The least time two CUDA events can read around a call: 20,000 pairs around nothing and
around a view (no kernel). Backs the sample floor in pike.evaluate.timing_window (MIN_SAMPLE_MS):
an honest call never times at 0. Prints one line per case; run on the GPU host.

    python bench/cuda_event_floor.py
"""

import torch


def main() -> None:
    x = torch.randn(1024, device="cuda")
    for label, fn in (("nothing", lambda: None), ("view", lambda: x.view(32, 32))):
        values = []
        for _ in range(20000):
            start, end, after = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            after.record()
            after.synchronize()
            values.append(start.elapsed_time(end))
        values.sort()
        print(label, "zeros", sum(v == 0.0 for v in values), "min", values[0],
              "median", values[len(values) // 2], "max", values[-1])


if __name__ == "__main__":
    main()
