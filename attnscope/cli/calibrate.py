"""``attnscope calibrate``: measure this machine's matmul throughput and copy bandwidth, once.

The roofline needs two peaks per device. A CUDA device attnscope knows by name gets the
datasheet's; a CPU, or any device, can instead be measured here: a square matmul at the dtype
(2·n³ FLOPs a run) and a copy between two buffers (each byte read once and written once, 2·size
bytes a run), timed ``--repeats`` times after a warm-up, the best run kept (a peak is the best the
device sustained). The result is saved (``attnscope._calibration``) and used by the worker of any
later process on this machine (``attnscope.roofline.peak_source=calibrated``) unless
``device_peaks`` is configured, which wins.
"""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Any

from .. import _calibration
from ._errors import CLIError, positive_int

__all__ = ["register", "measure"]

_DTYPES = ("float32", "bfloat16", "float16")


def _timed(fn: Any, sync: Any, repeats: int) -> list[float]:
    fn()  # warm-up: allocation, kernel selection, thread pool start
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def measure(device: str, dtype: str, n: int, copy_mib: int, repeats: int) -> dict[str, Any]:
    """Time the matmul and the copy; the entry :func:`_calibration.save` stores."""
    import torch

    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    a = torch.randn(n, n, device=dev).to(getattr(torch, dtype))
    b = torch.randn(n, n, device=dev).to(getattr(torch, dtype))
    mm = _timed(lambda: torch.mm(a, b), sync, repeats)
    elements = copy_mib * (1 << 20) // 4
    src = torch.ones(elements, device=dev)
    dst = torch.empty_like(src)
    cp = _timed(lambda: dst.copy_(src), sync, repeats)
    flops, moved = 2 * n ** 3, 2 * elements * 4
    return {
        "tflops": flops / min(mm) / 1e12,
        "gbps": moved / min(cp) / 1e9,
        "matmul": {"n": n, "flops": flops, "best_s": min(mm), "runs_s": mm},
        "copy": {"bytes": moved, "best_s": min(cp), "runs_s": cp},
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _main(args: argparse.Namespace) -> int:
    import torch

    device: str = args.device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CLIError("no CUDA device here: use --device cpu")
        key = _calibration.cuda_key(torch.cuda.get_device_name(torch.device(device)))
    elif device == "cpu":
        if args.threads:
            torch.set_num_threads(args.threads)
        key = _calibration.cpu_key(torch.get_num_threads())
    else:
        raise CLIError(f"--device must be cpu or cuda[:N], got {device!r}")
    n = args.n or (8192 if device.startswith("cuda") else 1024)
    mib = args.copy_mib or (1024 if device.startswith("cuda") else 256)
    entry = measure(device, args.dtype, n, mib, args.repeats)
    try:
        saved = _calibration.save(key, args.dtype, entry, None)
    except OSError as exc:
        raise CLIError(f"cannot save the calibration in {_calibration.path()}: "
                       f"{exc.strerror or exc}") from None
    mm, cp = entry["matmul"], entry["copy"]
    print(f"attnscope calibrate: {key}, {args.dtype}")
    print(f"  matmul {n}x{n} @ {n}x{n}: {mm['flops']:.4g} FLOP a run, best of {args.repeats} "
          f"{mm['best_s'] * 1e3:.3f} ms -> {entry['tflops']:.4g} TFLOP/s")
    print(f"  copy {mib} MiB (read + write): {cp['bytes']:.4g} B a run, best of {args.repeats} "
          f"{cp['best_s'] * 1e3:.3f} ms -> {entry['gbps']:.4g} GB/s")
    print(f"  saved to {saved}: used as peak_source=calibrated by later runs on this machine "
          f"(device_peaks, when configured, wins)")
    return 0


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope calibrate`` to the command line."""
    parser = sub.add_parser(
        "calibrate", formatter_class=formatter,
        help="measure this machine's peaks for the roofline (matmul and copy), once",
        description="Time a square matmul at --dtype and a buffer copy on --device, keep the "
                    "best of --repeats runs as its peaks, and save them for the roofline of "
                    "later runs on this machine (docs/profiling.md#reading-the-roofline).")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=_DTYPES,
                        help="the matmul's dtype (one peak per dtype; the bandwidth is shared)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="CPU threads to measure with (default: torch's); the peaks are "
                             "kept per thread count")
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed runs of each")
    parser.add_argument("--n", type=positive_int, default=None,
                        help="matmul size (default 1024 on CPU, 8192 on CUDA)")
    parser.add_argument("--copy-mib", type=positive_int, default=None,
                        help="copy size in MiB (default 256 on CPU, 1024 on CUDA)")
    parser.set_defaults(func=_main)
