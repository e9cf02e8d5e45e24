#!/usr/bin/env bash
# GPU check for the torch export (sampler, decoder, open rules), within 9 minutes on one
# CUDA device.
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# 1. the decoder and sampler tests on CUDA (CACTUS_TEST_DEVICE=cuda), and the self-distilled
#    answers of train-draft (generation and labels) on a tiny verifier there; tests/decode
#    includes test_hf_generate.py (model.generate(custom_generate=cactus_generate): greedy
#    equality with generate() on a ragged batch, same seed as speculative_generate, streamer);
# 2. the property-test kit's torch checks on CUDA (cactus check --rule --device cuda) for
#    every registered rule and the docs' example rule: same tokens as numpy from the same
#    uniforms, the torch law and the meter equal numpy's, the sampler's law by chi-square;
# 2b. the conformance suite on CUDA (cactus conform, reduced draws: 200,000 per law case,
#    each law test detecting a TV of about 0.008): FlashInfer's chain_speculative_sampling,
#    SGLang's tree_speculative_sampling_target_only on a chain, vLLM's Triton
#    rejection_sample (each where installed; --skip-missing lists the others) and our
#    sampler with SpS on cuda, every report in conform_gpu.json;
# 3. cactus bench sampler --device cuda: the built-ins at B=64, k=10, V=151,936, then every
#    rule (engines' and the docs' example on the generic adapter) at B=8, k=5, V=49,152;
# 4. cactus bench decode --device cuda on the stdlib pair (SmolLM2 cannot be fetched there),
#    then the trees against the chain there (SpS and Cactus δ = 1 at k = 3 beside the static
#    tree 4,2,1 and the EAGLE-2 tree dynamic:16, 6 interleaved rounds; on a GPU a tree's
#    extra nodes are nearly free, so the tree's AL should buy its speed);
# 5. the real pool on CUDA against the CPU (scripts/gpu_pool_check.py): the CPU's sampled
#    contexts teacher-forced on CUDA give the same (q, p) rows within 1e-4, and a pool built
#    wholly on CUDA, its positions/s; then `cactus tradeoff --device cuda` on the stdlib pair;
# 6. SGLang's tree kernel against our tree rule (scripts/sglang_tree_parity.py): the same
#    nodes and uniforms through sgl_kernel's tree_speculative_sampling_target_only and
#    trees.verify_node with sglang-tree, at four threshold settings (skipped, saying so,
#    when sgl_kernel is not importable).
#
# The pair: if $CACTUS_CACHE (default ~/.cache/cactus-theory) already holds the CPU-trained
# pair (copy that folder along to reuse it), it is used; otherwise a pair with the same
# configurations is trained on the GPU first (`cactus train-pair --device cuda`, about a
# minute; a different cache entry than the CPU pair). Outputs (logs and JSON) go to
# OUT_DIR (default: $OUT if set, else ./gpu-check). Time limits per stage: tests 140 s,
# rule kit 90 s, conformance 120 s, sampler 60 + 50 s, pair 100 s, decode 100 s, tree
# decode 80 s, pool 60 + 60 s, SGLang tree parity 60 s (worst case 920 s; a call may run
# 600 s, so give it timeout_s 600 and expect the last stages cut when the pair has to be
# trained or every GPU engine is installed).
# Exit status 1 if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
out="${1:-${OUT:-gpu-check}}"
mkdir -p "$out"
stamp() { echo "[$(date +%H:%M:%S)] $*"; }

python - <<'EOF' | tee "$out/device.txt" || exit 1
import torch, transformers
assert torch.cuda.is_available(), "no CUDA device"
print("torch", torch.__version__, "transformers", transformers.__version__)
print("device", torch.cuda.get_device_name(0))
EOF

stamp "tests on CUDA"
CACTUS_TEST_DEVICE=cuda timeout 140 python -m pytest -q -p no:cacheprovider \
  tests/decode tests/sampler/test_sampler_agreement.py tests/real/test_distill_answers.py \
  2>&1 | tee "$out/tests.log" | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

stamp "rule kit on CUDA"
# The docs' worked example (docs/rules.md's first Python block) as a rules module.
python - "$out/my_rules.py" <<'EOF'
import re, sys
from pathlib import Path
text = Path("docs/rules.md").read_text()
Path(sys.argv[1]).write_text(re.findall(r"```python\n(.*?)```", text, flags=re.S)[0])
EOF
kit_rules=(sps cactus:delta=1.0 cactus-exact:delta=0.5 frontier:delta=0.3 pareto:spread=2.0
  interp:alpha=0.3 tas topk:k=3 greedy sglang:threshold_single=0.3,threshold_acc=0.5
  relaxed:top_k=10,delta=0.6 relaxed-ratio:top_k=3,ratio=0.3 scaled-cactus:delta=1.0)
timeout 90 python -m cactus_theory.cli check --device cuda --examples 25 \
  --rules-module "$out/my_rules.py" \
  --only torch-decisions-equal-numpy torch-law-equals-numpy sampler-law-chi-square \
  $(printf -- "--rule %s " "${kit_rules[@]}") > "$out/rule_kit.log" 2>&1
[ "$?" -eq 0 ] || status=1
grep -E "^check_rule|FAILED|failed" "$out/rule_kit.log"

stamp "conformance on CUDA"
timeout 120 python -m cactus_theory.cli conform flashinfer sglang vllm-triton cactus-torch \
  --rule sps --device cuda --skip-missing --draws 200000 --rule-draws 20000 --examples 40 \
  --jobs 1 --json "$out/conform_gpu.json" > "$out/conform_gpu.log" 2>&1
conform_status=$?
# Exit 1 is a finding in an engine (reported, not a failure of this script); 2 or a timeout is.
[ "$conform_status" -le 1 ] || status=1
grep -E "^\| |not run|^done" "$out/conform_gpu.log"

stamp "bench sampler"
timeout 60 python -m cactus_theory.cli bench sampler --device cuda --repeats 5 \
  --json "$out/bench_sampler.json" 2>&1 | tee "$out/bench_sampler.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 50 python -m cactus_theory.cli bench sampler --device cuda --repeats 5 \
  --workload 8x5x49152 --rules-module "$out/my_rules.py" \
  --rule sps --rule cactus:delta=1.0 --rule tas --rule relaxed:top_k=10,delta=0.6 \
  --rule sglang:threshold_single=0.3,threshold_acc=0.3 --rule relaxed-ratio:top_k=4,ratio=0.5 \
  --rule scaled-cactus:delta=1.0 \
  --json "$out/bench_sampler_open.json" 2>&1 | tee "$out/bench_sampler_open.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

stamp "pair"
# The GPU machine cannot fetch SmolLM2 (no network, 64 MiB per call), so the decoder bench
# runs on the stdlib pair: the cached CPU-trained one if it came along, else trained here.
device_setting=cpu
if python - <<'EOF'
import sys
from cactus_theory.real import train_pair
from cactus_theory.real.train_pair import PAIR_MANIFEST, PairSettings
sys.exit(0 if (train_pair.pair_dir(PairSettings()) / PAIR_MANIFEST).exists() else 1)
EOF
then
  stamp "using the cached CPU-trained pair"
else
  stamp "no cached pair: training one on the GPU"
  device_setting=cuda
  timeout 100 python -m cactus_theory.cli train-pair --device cuda > "$out/train_pair.log" 2>&1 \
    || status=1
  tail -6 "$out/train_pair.log"
fi
pair_dir=$(DEVICE_SETTING=$device_setting python - <<'EOF'
import dataclasses, os
from cactus_theory.real import train_pair
from cactus_theory.real.train_pair import PairSettings
settings = dataclasses.replace(PairSettings(), device=os.environ["DEVICE_SETTING"])
print(train_pair.pair_dir(settings))
EOF
)
pair_args=(--verifier "$pair_dir/verifier" --draft "$pair_dir/draft" --prompts "$pair_dir/heldout_prompts.jsonl")

stamp "bench decode"
timeout 100 python -m cactus_theory.cli bench decode --device cuda --repeats 2 "${pair_args[@]}" \
  --json "$out/bench_decode.json" > "$out/bench_decode.log" 2>&1 || status=1
grep -v "it/s\]" "$out/bench_decode.log" | tail -16
stamp "bench decode: trees against the chain"
timeout 80 python -m cactus_theory.cli bench decode --device cuda --repeats 6 "${pair_args[@]}" \
  --num-prompts 4 --max-new-tokens 32 --rule sps --rule cactus:delta=1.0 -k 3 \
  --tree 4,2,1 --tree dynamic:16 --json "$out/bench_decode_trees.json" \
  > "$out/bench_decode_trees.log" 2>&1 || status=1
grep -v "it/s\]" "$out/bench_decode_trees.log" | tail -10
stamp "pool on CUDA against the CPU"
timeout 60 python scripts/gpu_pool_check.py "$pair_dir" cuda 2>&1 | grep -v "Loading weights" \
  | tee "$out/pool_check.json" | tail -2
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 60 python -m cactus_theory.cli tradeoff --device cuda --dtype float32 --no-costs \
  --verifier "$pair_dir/verifier" --draft "$pair_dir/draft" --raw --quiet \
  --dataset "$pair_dir/heldout_prompts.jsonl" --positions 1000 --cache "$out/pools" \
  --out "$out/tradeoff" > "$out/tradeoff.log" 2>&1 || status=1
grep -E "^pool:|^sps |^cactus:delta=1.0 |frontier check|^On " "$out/tradeoff.log"
stamp "SGLang tree kernel parity"
PYTHONPATH=. timeout 60 python scripts/sglang_tree_parity.py --nodes 3000 \
  --json "$out/sglang_tree_parity.json" > "$out/sglang_tree_parity.log" 2>&1 || status=1
grep -E "skipped|mismatches|passed" "$out/sglang_tree_parity.log" | tr -d ' ' | paste -sd' '
stamp "done (status $status)"
exit "$status"
