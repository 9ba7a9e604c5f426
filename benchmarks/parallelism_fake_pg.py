"""One tensor-parallel rank's real training step on CPU, on torch's fake process group, vs the estimate.

Run: ``PYTHONPATH=. python benchmarks/parallelism_fake_pg.py``. CPU only (torch, transformers).

For tp in 1, 2, 4: a tiny Llama (128 wide, 2 layers, 8 heads, 4 kv heads, vocab 512, fp32, SDPA) is saved with
random weights and loaded with ``from_pretrained(tp_plan="auto")`` in a process that is rank 0 of a fake
``tp``-rank world (``torch.testing._internal.distributed.fake_pg``: collectives are no-ops, every local tensor
is real). One forward + loss + backward runs under fitcheck's live-tensor tracker (DTensors counted by their
local shard). Printed next to ``fitcheck estimate --device_type cpu --tp_size tp`` of the same run: the rank's
weights, the bytes alive at the end of forward besides the weights, and the step's peak besides the weights.
Each tp runs in its own process (a process group is process-global).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

_CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}
BATCH, SEQ = 2, 64


def measure(tp: int) -> dict[str, int]:
    """Rank 0's measured bytes in a fake ``tp``-rank world (call once per process)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from fitcheck.torch_adapters import LiveTensorTracker

    class LocalShardTracker(LiveTensorTracker):
        def _add(self, tensor: object) -> None:
            super()._add(tensor._local_tensor if isinstance(tensor, DTensor) else tensor)

    os.environ.update(WORLD_SIZE=str(tp), RANK="0", LOCAL_RANK="0")
    dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
    with tempfile.TemporaryDirectory() as d:
        LlamaForCausalLM(LlamaConfig(**_CONFIG)).save_pretrained(d)
        extra = {"tp_plan": "auto"} if tp > 1 else {}
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa", **extra)
    model.train()
    ids = torch.randint(0, _CONFIG["vocab_size"], (BATCH, SEQ))
    local = [p._local_tensor if isinstance(p, DTensor) else p for p in model.parameters()]
    weights = sum(p.numel() * p.element_size() for p in local)
    tracker = LocalShardTracker()
    tracker.track(local)
    base = tracker.current
    tracker.start()
    out = model(input_ids=ids, labels=ids)
    forward_end = tracker.current - base
    out.loss.backward()
    tracker.stop()
    dist.destroy_process_group()
    return {"weights": weights, "forward_end": forward_end, "peak": tracker.peak - base}


def estimated(tp: int) -> dict[str, int]:
    """fitcheck's numbers for the same rank."""
    from fitcheck.cli import spec_from_values
    from fitcheck.core import estimate
    from fitcheck.report import Phase

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({**_CONFIG, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                       "torch_dtype": "float32"}, f)
        values: dict[str, object] = {
            "model_name_or_path": d, "dtype": "float32", "per_device_train_batch_size": str(BATCH),
            "max_seq_length": str(SEQ), "device_type": "cpu", "attn_implementation": "sdpa", "optim": "sgd",
            "num_processes": str(tp),
        }
        if tp > 1:
            values["tp_size"] = str(tp)
        spec, _ = spec_from_values(values, {})
    rep = estimate(spec)
    totals = rep.phase_totals()
    weights = sum(c.at(Phase.FORWARD_END) for c in rep.components if c.name.startswith("weights"))
    step = max(totals[p] for p in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD))
    return {"weights": weights, "forward_end": totals[Phase.FORWARD_END] - weights, "peak": step - weights}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(measure(int(sys.argv[2]))))
        return
    print(f"{'tp':>3} {'':<22} {'measured':>10} {'estimate':>10} {'error':>8}")
    for tp in (1, 2, 4):
        out = subprocess.run([sys.executable, __file__, "--child", str(tp)], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        real = json.loads(out.stdout.strip().splitlines()[-1])
        est = estimated(tp)
        for key, label in (("weights", "rank's weights"), ("forward_end", "end of forward - weights"),
                           ("peak", "step peak - weights")):
            err = (est[key] - real[key]) / real[key]
            print(f"{tp:>3} {label:<22} {real[key]:>10,} {est[key]:>10,} {err:>+8.2%}")


if __name__ == "__main__":
    main()
