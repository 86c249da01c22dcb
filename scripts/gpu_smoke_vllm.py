"""GPU smoke test of the vLLM backend (run on a machine with a GPU and the [gpu] extra).

Builds a tiny Qwen3 model locally, then checks on the GPU that:
1. vLLM and the ``hf`` backend agree on greedy tokens and (closely) on logprobs;
2. ``load_weights`` pushes new weights in place: after loading a perturbed state dict,
   vLLM's greedy output matches the ``hf`` backend running the perturbed model.
Prints one JSON line with the results; exits non-zero on a mismatch.

    python scripts/gpu_smoke_vllm.py --out /tmp/tiny
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from sera_core.policy.base import SamplingParams
from sera_core.policy.hf import HFPolicy
from sera_core.policy.tiny import TinyModelConfig, build_tiny
from sera_core.policy.vllm_backend import VLLMPolicy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/sera_tiny_gpu")
    args = ap.parse_args()
    texts = ["<thought>look</thought><python>print(view_inventory())</python>",
             "Craft the following items: 3x a1_i5", "<action>take red apple</action>"] * 200
    build_tiny(args.out, texts, vocab_size=512, cfg=TinyModelConfig(hidden_size=128, num_hidden_layers=2))
    hf = HFPolicy(args.out, device="cuda", dtype=torch.float32)
    vl = VLLMPolicy(args.out, dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)
    prompt = hf.chat_prompt([{"role": "user", "content": "Craft the following items: 3x a1_i5"}])
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    a, b = hf.generate([prompt], params)[0], vl.generate([prompt], params)[0]
    same_tokens = a.token_ids == b.token_ids
    max_lp_diff = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) if same_tokens else None
    torch.manual_seed(1)
    perturbed = {k: v + 0.05 * torch.randn_like(v) for k, v in hf.model.state_dict().items()}
    hf.model.load_state_dict(perturbed)
    vl.load_weights(perturbed)
    c, d = hf.generate([prompt], params)[0], vl.generate([prompt], params)[0]
    result = {"same_greedy_tokens": same_tokens, "max_logprob_diff": max_lp_diff,
              "weights_pushed": c.token_ids == d.token_ids, "changed_by_push": c.token_ids != a.token_ids}
    print(json.dumps(result))
    ok = same_tokens and max_lp_diff is not None and max_lp_diff < 1e-2 and result["weights_pushed"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
