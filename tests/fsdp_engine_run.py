"""One process of the FSDP2 weight-push check (tests/test_vllm_backend.py): fault B on CPU.

``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/fsdp_engine_run.py OUT PUSHES``,
``PUSHES`` a comma-separated list of ``old`` and ``new`` (``old,new``: the old push, then the new).

Every process builds the same random Qwen3 (:func:`~sera_core.policy.tiny.init_model`, seed 0,
tied embeddings) with the workbook's tokenizer (:func:`~sera_core.agents.corpus.default_tokenizer`);
rank 0 saves both as a Hugging Face folder ``OUT/model`` before sharding (a barrier: the
others wait for it). The model is sharded with torch's own FSDP2 over gloo (``fully_shard``
on each decoder layer, then the root, as in tests/fsdp_run.py; no Accelerate) and trained
two AdamW updates at lr 1e-2 on random tokens, which moves its logprobs far from the folder's.
Then every process starts its own vLLM CPU engine on the folder (``VLLMPolicy(...,
distributed=True)``: ``external_launcher``, the group above) and, for each push in ``PUSHES``:

* ``new``: pushes :func:`~sera_core.policy.models.engine_state` (full tensors on every process);
* ``old``: pushes what the trainer pushed before (fault B): the rank-0 gather of
  :func:`~sera_core.utils.weights.trained_state` (``accelerator.get_state_dict`` under FSDP),
  full tensors on rank 0 and an empty dict on every other process;

then generates greedily on three prompts and scores those exact tokens with the sharded
model (float32, teacher-forced through :func:`~sera_core.train.update.sequence_logprobs`;
an FSDP forward is a collective: every process runs the same number of forwards, each on its
own engine's tokens) and with the folder's own weights (a plain model loaded from ``OUT/model``).
Each process writes ``OUT/result.<rank>.json``: ``rank``, ``processes``, ``sharded``, the
engine's ``device``, and per push the tensors pushed, the tokens, the engine's, the
model's and the folder weights' logprobs and ``max_diff`` (engine vs model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from sera_core.agents.corpus import default_tokenizer
from sera_core.policy.base import SamplingParams
from sera_core.policy.models import engine_state
from sera_core.policy.tiny import TinyModelConfig, init_model
from sera_core.train.update import sequence_logprobs
from sera_core.utils.weights import trained_state

MODEL = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=32, max_position_embeddings=256)
"""Small enough for a CPU; ``head_dim`` 32, the smallest vLLM's CPU attention takes."""


def logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """``model``'s float32 logprobs of ``tokens`` after ``prompt`` (teacher-forced)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        return sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt) - 1:].tolist()


def main(out: Path, pushes: list[str]) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = out / "model"
    tokenizer = default_tokenizer()
    model = init_model(tokenizer, MODEL, seed=0)
    if rank == 0:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    dist.barrier()  # the folder is whole before any process reads it
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for s in range(2):
        ids = torch.randint(0, len(tokenizer), (4, 16), generator=torch.Generator().manual_seed(s))[rank::world]
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    original = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    from sera_core.policy.vllm_backend import EngineConfig, VLLMPolicy

    policy = VLLMPolicy(folder, EngineConfig(dtype="float32", kv_cache_gib=0.05, max_model_len=256), distributed=True)
    prompts = [policy.chat_prompt([{"role": "user", "content": f"Craft the following items: {k}x a1_i{k}"}])
               for k in range(1, 4)]
    result = {"rank": rank, "processes": world, "sharded": type(next(model.parameters())).__name__ == "DTensor",
              "device": policy.device()}
    for push in pushes:
        state = engine_state(model) if push == "new" else trained_state(model)  # both collectives
        pushed = policy.load_weights(state)
        gens = policy.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12))
        engine = [g.logprobs for g in gens]
        ours = [logprobs(model, p, g.token_ids) for p, g in zip(prompts, gens, strict=True)]
        folders = [logprobs(original, p, g.token_ids) for p, g in zip(prompts, gens, strict=True)]
        result[push] = {"pushed": pushed, "tokens": [g.token_ids for g in gens], "engine": engine, "model": ours,
                        "original": folders,
                        "max_diff": max(abs(a - b) for e, m in zip(engine, ours, strict=True)
                                        for a, b in zip(e, m, strict=True))}
    (out / f"result.{rank}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()  # leave together: a process that tears gloo down while another still works may abort
    policy.close()  # last: it ends the process's distributed state too (VLLMPolicy.close)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(","))
