#!/usr/bin/env python3
"""Writes SST-style sentiment trees for measuring the Tree-LSTM trainer on
data shaped like the Stanford Sentiment Treebank's (which cannot be
downloaded here): binary parse trees in PTB brackets, a label 0-4 at every
node, sentence lengths drawn around SST's (mean ~19 words, 2 to 52), words
from a Zipf-distributed vocabulary, so that every tree's shape differs and
trees are deeper than ListOps'. A word has a hidden polarity; a node's label
is the sum of its subtree's polarities over the square root of its length,
banded into five classes, so that the task can be learned and every class
occurs at every depth.

  sst_like.py --trees 3000 --seed 1 > train.txt
  sst_like.py --trees 500 --seed 2 > dev.txt
then: bazel run --config=opt //examples/treelstm:train -- --data sst
      --train train.txt --dev dev.txt --reshuffle
"""
import argparse
import random
import sys


def sentence_length(rng):
    # SST's sentence lengths: mean ~19, long right tail, at least 2.
    return max(2, min(52, int(rng.gammavariate(4.0, 4.8))))


def tree(rng, words, polarity):
    """A random binary bracketing of `words`: (text, sum of polarities, words)."""
    if len(words) == 1:
        p = polarity[words[0]]
        return f"({label(p, 1)} {words[0]})", p, 1
    split = rng.randint(1, len(words) - 1)
    left, lp, ln = tree(rng, words[:split], polarity)
    right, rp, rn = tree(rng, words[split:], polarity)
    p, n = lp + rp, ln + rn
    return f"({label(p, n)} {left} {right})", p, n


def label(polarity_sum, words):
    return max(0, min(4, round(2 + 1.5 * polarity_sum / words ** 0.5)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=int, default=3000, help="trees to write")
    parser.add_argument("--vocabulary", type=int, default=5000, help="distinct words")
    parser.add_argument("--seed", type=int, default=1, help="the trees (the vocabulary's polarities: always seed 0)")
    args = parser.parse_args()
    vocab_rng = random.Random(0)  # the same words and polarities for a train and a dev file
    vocabulary = [f"w{i}" for i in range(args.vocabulary)]
    polarity = {w: vocab_rng.gauss(0.0, 0.6) for w in vocabulary}
    weights = [1.0 / (i + 1) for i in range(args.vocabulary)]  # Zipf
    rng = random.Random(args.seed)
    out = sys.stdout
    for _ in range(args.trees):
        words = rng.choices(vocabulary, weights=weights, k=sentence_length(rng))
        text, _, _ = tree(rng, words, polarity)
        out.write(text + "\n")


if __name__ == "__main__":
    main()
