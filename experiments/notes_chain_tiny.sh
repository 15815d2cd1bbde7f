#!/usr/bin/env bash
# The SFT chain that makes the long-episode RL stage's start policy (experiments/rl_notes_tiny.py):
# the shipped reading policy (experiments/policies/reader_tiny) taught to copy a note's value
# from a tool response into its summary, and from its summary into its code, across the cuts
# of a chain (c2/envs/notes.py, two notes of ~80 bytes, cut after each read).
#
#   bash experiments/notes_chain_tiny.sh [DIR]          (default DIR: runs/notes_chain)
#
# Three `python -m c2.main` stages into DIR/1_tool_recall, DIR/2_notes_mix and DIR/3_notes, each
# from the last, then held-out episodes of the last (DIR/heldout_t0 greedy, DIR/heldout_t1). Start
# the RL stage or the comparison of the three context modes from it:
#   python -m c2.main --config=experiments/rl_notes_tiny.py --workdir=DIR/rl \
#       --config.init_from=DIR/3_notes
#   python -m c2.bench.context_management --init_from=DIR/3_notes
# Killed at any point, the same command resumes (every stage resumes its workdir; the held-out
# runs resume their episodes). What it gave (2026-12-06, CPU-2; BENCHMARKS.md, issue 16):
#   1 (tool recall)      the copy of the reader moved into a tool response ("Report k (see
#                        notes/e.txt)", read_file, "Found k = v.")
#   2 (chains + 1's data) held-out value digits (teacher-forced) 0.63 / 0.78 / 0.82 at steps
#                        200 / 400 / 800; greedy episodes pass 0 of 48: the second summary
#                        writes the second note's value for both ("Found a = 35, b = 35")
#   3 (chains alone)     digits 0.905; held-out pass@1 0.25 greedy, 0.10 at temperature 1
# Runtime: ~35 min on the 2-core reference machine with nothing else running (1.0 s a step in
# stage 1, 1.4 s in stages 2-3). Every stage runs without YaRN (factor 0).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-runs/notes_chain}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DIR"

stage() {  # NAME CONFIG INIT_FROM ARGS...
  local name=$1 config=$2 init=$3
  shift 3
  echo "$(date +%T) stage $name"
  "$PY" -m c2.main --config="experiments/$config" --workdir="$DIR/$name" \
    --config.init_from="$init" --config.model.yarn.factor=0. "$@"
}

# 1. Recall by key from a tool response (experiments/tool_recall.py): the reader copies from its
#    user turn, and the copy the tiny model learns is tied to the form it was taught in.
"$PY" experiments/tool_recall.py "$DIR/tool_recall.jsonl"
stage 1_tool_recall sft_agent_tiny.py hf:experiments/policies/reader_tiny \
  --config.data.corpus="$DIR/tool_recall.jsonl" --config.data.batch_size=8 \
  --config.optimizer.lr=1e-3 --config.optimizer.warmup_steps=30 --config.train.steps=300
# 2. The oracle chains of 6,000 train tasks, each cut after its first and its second read (where
#    the RL stage's trigger cuts), with stage 1's data in the mixture.
"$PY" -m c2.envs.notes --chains --out "$DIR/chains.jsonl" --n 6000 --seed 1 --split train \
  --files 2 --note_chars 80 --level fixed --cuts 1,2
stage 2_notes_mix sft_notes_tiny.py "$DIR/1_tool_recall" \
  --config.data.corpus="$DIR/chains.jsonl+$DIR/tool_recall.jsonl" \
  --config.optimizer.lr=5e-4 --config.optimizer.warmup_steps=30 --config.train.steps=800
# 3. The chains alone: the second summary copies the first note's value from the summary it
#    began from, not the newest number in its context.
stage 3_notes sft_notes_tiny.py "$DIR/2_notes_mix" --config.data.corpus="$DIR/chains.jsonl" \
  --config.optimizer.lr=3e-4 --config.optimizer.warmup_steps=20 --config.train.steps=400
"$PY" -m c2.eval.copying --policy "$DIR/3_notes" --gaps 0 --notes notes:fixed:2:80 \
  | tee "$DIR/3_notes.probe"
# Held-out episodes as the RL stage plays them (its held-out tasks, its budgets).
"$PY" -m c2.envs.notes --out "$DIR/heldout" --n 24 --seed 1 --split eval --files 2 \
  --note_chars 80 --level fixed
for t in 0 1; do
  "$PY" -m c2.eval.run --tasks "$DIR/heldout" --policy "$DIR/3_notes" --samples 2 \
    --out "$DIR/heldout_t$t" --temperature "$t" --context_management self_summary \
    --summary_trigger 400 --max_tokens 800 --max_turn_tokens 256 --summary_max_tokens 96 \
    --max_turns 8
done
echo "$(date +%T) done: the start policy is $DIR/3_notes"
