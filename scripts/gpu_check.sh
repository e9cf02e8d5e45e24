#!/usr/bin/env bash
# GPU check for the torch export (sampler + decoder), within 8 minutes on one CUDA device.
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# 1. the decoder and sampler tests on CUDA (CACTUS_TEST_DEVICE=cuda), and the self-distilled
#    answers of train-draft (generation and labels) on a tiny verifier there; tests/decode
#    includes test_hf_generate.py (model.generate(custom_generate=cactus_generate): greedy
#    equality with generate() on a ragged batch, same seed as speculative_generate, streamer);
# 2. cactus bench sampler --device cuda (B=64, k=10, V=151,936, float32);
# 3. cactus bench decode --device cuda on the stdlib pair (SmolLM2 cannot be fetched there).
#
# The pair: if $CACTUS_CACHE (default ~/.cache/cactus-theory) already holds the CPU-trained
# pair (copy that folder along to reuse it), it is used; otherwise a pair with the same
# configurations is trained on the GPU first (`cactus train-pair --device cuda`, about a
# minute; a different cache entry than the CPU pair). Outputs (logs and JSON) go to
# OUT_DIR (default: $OUT if set, else ./gpu-check). Time limits per stage: tests 140 s,
# sampler 100 s, pair 100 s, decode 120 s (worst case 460 s, under 8 minutes with start-up).
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

stamp "bench sampler"
timeout 100 python -m cactus_theory.cli bench sampler --device cuda --repeats 5 \
  --json "$out/bench_sampler.json" 2>&1 | tee "$out/bench_sampler.log"
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
timeout 120 python -m cactus_theory.cli bench decode --device cuda --repeats 2 "${pair_args[@]}" \
  --json "$out/bench_decode.json" > "$out/bench_decode.log" 2>&1 || status=1
grep -v "it/s\]" "$out/bench_decode.log" | tail -16
stamp "done (status $status)"
exit "$status"
