#!/bin/sh
# A small learning-rate sweep: the synthetic MLP (../synthetic/mlp.toml)
# three times, one --set learning rate each, every run in its own directory
# under examples/sweep/runs/ with a TensorBoard event file. Then
#     tensorboard --logdir examples/sweep/runs
# shows the three runs side by side, and the HPARAMS tab one row per run:
# its manifest's keys (optimizer.lr, model.hidden, ...) and its last metrics.
# Extra arguments go to every `kiln fit`: sh sweep.sh --set trainer.max_epochs=1
set -eu
here=$(cd "$(dirname "$0")" && pwd)
kiln=${KILN:-$here/../../build/bin/kiln}
for lr in 3e-4 1e-3 3e-3; do
  "$kiln" fit "$here/../synthetic/mlp.toml" \
    --set optimizer.lr=$lr \
    --set run.name=lr_$lr \
    --set run.dir="$here/runs/lr_$lr" \
    --set 'logging.loggers=["csv", "tensorboard"]' \
    "$@"
done
echo "done: tensorboard --logdir $here/runs"
