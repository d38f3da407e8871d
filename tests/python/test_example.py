"""examples/python/treelstm.py: its data readers and a short run end to end."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.getcwd(), "examples", "python"))
import treelstm as example  # noqa: E402

SST = os.path.join(os.getcwd(), "examples", "treelstm", "testdata")


def test_listops_values_follow_listops_h():
    parse = lambda text: example.listops_parse(text, "t")  # noqa: E731
    assert example.listops_value(parse("[MAX 2 9 [MIN 4 7 ] 1 ]")) == 9
    assert example.listops_value(parse("[MED 4 8 3 3 ]")) == 3  # even count: (3 + 4) // 2
    assert example.listops_value(parse("[SM 7 8 [MED 1 5 9 ] ]")) == 0
    with pytest.raises(ValueError, match="t: unbalanced brackets"):
        parse("[MAX 1 2")
    with pytest.raises(ValueError, match="unknown operator '\\[AVG'"):
        parse("[AVG 1 2 ]")


def test_sst_trees_become_token_trees_with_one_token_for_inner_nodes():
    label, word, children = example.sst_parse("(3 (2 It) (4 (2 's) (4 treat)))", "t")
    assert (label, word, len(children)) == (3, None, 2)
    vocabulary = {"<node>": 0, "<unk>": 1}
    ((tree, y),) = example.sst_examples([example.sst_parse("(1 (2 a) (0 b))", "t")], vocabulary, grow=True)
    assert y == 1 and tree == (0, [(2, []), (3, [])])
    with pytest.raises(ValueError, match="t: expected a label after '\\('"):
        example.sst_parse("((2 a))", "t")


@pytest.mark.parametrize("data", ["listops", "sst"])
def test_a_short_run_trains_and_ends_with_a_json_line(data):
    args = ["--size", "100", "--dev-size", "20", "--epochs", "2", "--batch", "10", "--embed", "8", "--hidden", "8"]
    if data == "sst":
        args = ["--data", "sst", "--train", os.path.join(SST, "sst_sample_train.txt"), "--dev",
                os.path.join(SST, "sst_sample_dev.txt"), "--epochs", "2", "--batch", "4", "--embed", "8",
                "--hidden", "8"]
    out = subprocess.run([sys.executable, os.path.join("examples", "python", "treelstm.py"), *args],
                         capture_output=True, text=True, check=True)
    epochs = json.loads(out.stdout.strip().splitlines()[-1])["epochs"]
    assert len(epochs) == 2 and epochs[1]["loss"] < epochs[0]["loss"]
    assert "epoch 1: loss" in out.stdout


def test_a_missing_file_is_an_error_that_names_it():
    out = subprocess.run([sys.executable, os.path.join("examples", "python", "treelstm.py"), "--train", "/no/such"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "/no/such" in out.stderr
