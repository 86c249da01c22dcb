"""The embedded tiny model: demonstrations, the imitation warm start, the build recipe.

* :mod:`~sera_core.tiny.demos`: expert demonstrations of all three roles, drawn from many
  freshly generated worlds, as token-exact training samples;
* :mod:`~sera_core.tiny.sft`: the supervised loop (Accelerate; loss on completion tokens);
* :mod:`~sera_core.tiny.recipe`: the whole recipe (tokenizer, model, demonstrations,
  training, manifest) and the shipped model.

The tiny model is a stand-in for an instruction-tuned base model, trained by imitation
of a scripted expert; it is not a reproduction of Qwen3-4B.
"""
