"""The vLLM worker extension that takes a trainer's weights (``worker_extension_cls``).

vLLM mixes this class into every worker of an engine started by
:class:`~sera_core.policy.vllm_backend.VLLMPolicy` (its qualified name is passed as
``worker_extension_cls``), and ``LLM.collective_rpc(method, args)`` calls its methods on
every worker of that engine: in the caller's process when the engine runs in-process, in
the engine's processes otherwise. Nothing is pickled as code: the call carries a method
name and plain arguments (no ``VLLM_ALLOW_INSECURE_SERIALIZATION``).

Both methods hand the weights to the worker's own ``reload_weights(weights_iterator=...)``,
which loads checkpoint-format tensors the way each device needs: on GPUs into the model's
parameters, on CPUs through the kernels' repacking (the CPU backend repacks linear weights
and leaves the original parameters empty, so calling ``model.load_weights`` directly fails
there with "Attempted to load weight ... into parameter (torch.Size([0]))").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class WeightLoader:
    """Methods mixed into vLLM's worker class (``self`` is the worker)."""

    def sera_reload(self, weights: Iterable) -> int:
        """Load ``(name, tensor)`` pairs given in memory (engine in the caller's process), one
        at a time as ``weights`` yields them (a generator streams them). Returns how many
        tensors were loaded."""
        count = 0

        def counted() -> Iterator:
            nonlocal count
            for pair in weights:
                count += 1
                yield pair

        self.reload_weights(weights_iterator=counted())
        return count

    def sera_reload_file(self, path: str) -> int:
        """Load every tensor of the safetensors file ``path`` (engine in its own process: the
        caller wrote the file), one tensor at a time. Returns how many tensors were loaded."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            names = list(f.keys())

            def tensors() -> Iterator:
                for name in names:
                    yield name, f.get_tensor(name)

            self.reload_weights(weights_iterator=tensors())
        return len(names)

    def sera_device(self) -> str:
        """The device the engine's weights sit on (``cuda:1``, ``cpu``)."""
        return str(next(self.get_model().parameters()).device)
