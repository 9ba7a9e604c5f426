"""FSDP-QLoRA (70B on 2 x 24 GB) estimates next to the published figures, and the 4-bit bytes per GPU.

Run: ``PYTHONPATH=. python benchmarks/fsdp_qlora_published.py``. CPU only, no torch import.

Each row of ``benchmarks/data/fsdp_qlora_published.json`` is a published run (source, quote, the accelerate
config it used and the ``fitcheck estimate`` flags that describe it). The script writes the accelerate config to
a temporary file, estimates, and prints the per-GPU used memory (nvidia-smi-like: reserved + CUDA context +
NCCL) next to the published figure read both as GB (1e9) and as GiB (the publications do not say), the host RAM
per node, and the split of the per-GPU peak. A second table shows, for the same 70B, where the 4-bit base goes
under each ``bnb_4bit_quant_storage`` / FSDP version / offload choice. The published runs used older
transformers, whose loader quantized on the GPU and moved the weights to CPU; with transformers 5.23 the load
itself does not fit a 24 GB GPU (the ``load-does-not-fit`` finding), so the step is what is compared.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from fitcheck.cli import spec_from_values
from fitcheck.core import estimate
from fitcheck.errors import ConfigError
from fitcheck.report import Location, Report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallelism_published import _values  # the same argv -> estimate values reader

DATA = Path(__file__).resolve().parent / "data" / "fsdp_qlora_published.json"
GIB = 1024**3


def _estimate(row: dict[str, object], tmp: Path, **extra: object) -> Report:
    cfg = tmp / f"{row['id']}.yaml"
    cfg.write_text(json.dumps(row["config_file"]))  # JSON is YAML
    values = {**_values(list(row["argv"])), "config_file": str(cfg), "no_trace": True, **extra}  # type: ignore[call-overload]
    spec, _ = spec_from_values(values, env={})
    return estimate(spec)


def _split(report: Report) -> str:
    at = report.peak_phase
    parts = sorted(((c.at(at), c.name) for c in report.components if c.location is Location.DEVICE), reverse=True)
    return ", ".join(f"{n} {b / GIB:.2f}" for b, n in parts[:6] if b >= GIB // 100)


def main() -> None:
    """Print estimate vs published, then where the 4-bit bytes go."""
    rows = json.loads(DATA.read_text())["rows"]
    print(f"{'row':28} {'published':>10} {'est used GiB':>12} {'err (GB)':>9} {'err (GiB)':>9} {'host GiB':>9}"
          "  pub host")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        reports = {}
        for row in rows:
            rep = _estimate(row, tmp)
            reports[row["id"]] = rep
            pub = float(row["memory_value"])
            used = rep.device_used_bytes
            err_gb = (used - pub * 1e9) / (pub * 1e9) * 100
            err_gib = (used - pub * GIB) / (pub * GIB) * 100
            host = row.get("host_reported") or "-"
            print(f"{row['id']:28} {row['memory_reported']:>10} {used / GIB:12.2f} {err_gb:+8.1f}% {err_gib:+8.1f}% "
                  f"{rep.host_bytes / GIB:9.2f}  {host}")
        print("\nper-GPU peak split (GiB, at the estimate's peak phase):")
        for rid, rep in reports.items():
            print(f"  {rid}: {rep.peak_phase.value}: {_split(rep)}")
            for f in rep.findings:
                if f.code in ("load-does-not-fit", "fsdp-load-gpu-peak"):
                    print(f"    [{f.severity.value}] {f.code}: {f.message[:160]}...")
        print("\nwhere the 4-bit base goes (70B, offload off, 80 GiB GPUs), GiB per GPU:")
        print(f"  {'storage / FSDP':24} {'packed':>8} {'state':>8} {'gathered unit':>14}")
        base = rows[1]
        for storage, version in (("bfloat16", 2), ("uint8", 2), ("bfloat16", 1), ("uint8", 1)):
            fsdp = {**base["config_file"]["fsdp_config"], "fsdp_version": version}
            cfg = {**base["config_file"], "fsdp_config": fsdp}
            try:
                rep = _estimate({**base, "config_file": cfg}, tmp, bnb_4bit_quant_storage=storage)
            except ConfigError as exc:
                print(f"  {storage + ' / FSDP' + str(version):24} refused: {str(exc)[:90]}...")
                continue
            comp = {c.name: c for c in rep.components}
            packed = comp["weights.quantized"].peak_bytes / GIB
            state = comp["quantization.metadata"].peak_bytes / GIB
            unit = comp["buffers.fsdp_unsharded_params"].peak_bytes / GIB
            print(f"  {storage + ' / FSDP' + str(version):24} {packed:8.2f} {state:8.2f} {unit:14.2f}")


if __name__ == "__main__":
    main()
