"""The language-modelling workload: Shakespeare's reader, windows and partitions by play, the
character transformer, loss as the figure of merit, and a run of it end to end — on a small
generated corpus laid out as the real one."""

from __future__ import annotations

import json
import math
import os
import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetsync.config import Config
from hetsync.options import ConfigError
from hetsync.data import DataFormatError, DataNotFoundError, partition
from hetsync.data.shakespeare import SUFFIX, VALIDATION, load_shakespeare
from hetsync.data.text import Vocabulary
from hetsync.models import build_model, count_parameters
from hetsync.runtime import checkpoint
from hetsync.runtime.launcher import launch
from hetsync.telemetry.metric import LOSS
from hetsync.telemetry.summarize import summarize, time_to_target

WORDS = ("thou art my lord and i am thy servant good night sweet prince the king doth "
         "wake to night what light through yonder window breaks").split()


def write_corpus(folder, works: int = 8, chars: int = 4000, seed: int = 0) -> list[str]:
    """`works` texts of about `chars` characters each, named as the package's files: the two
    held-out plays and `works - 2` others; a work's lines are its speaker's name and words of
    one shared list, each play favouring some (plays differ, and share a language)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    names = list(VALIDATION) + [f"play_{i}" for i in range(works - len(VALIDATION))]
    for name in names:
        weights = [rng.random() + 0.5 for _ in WORDS]
        lines = []
        while sum(map(len, lines)) < chars:
            lines.append(f"{name.upper()}.\n" + " ".join(rng.choices(WORDS, weights, k=8)))
        (folder / f"{name}{SUFFIX}").write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    return names


@pytest.fixture
def corpus(tmp_path):
    write_corpus(tmp_path / "shakespeare")
    return tmp_path


# ---------------------------------------------------------------------- the reader
def test_reader_splits_by_play_and_windows_never_cross_a_work(corpus):
    split = load_shakespeare(str(corpus), context=16)
    assert set(split.test.works) == set(VALIDATION)
    assert not set(split.train.works) & set(VALIDATION)
    assert split.input_shape == (16,) and split.num_classes == len(split.vocabulary)
    x, y = split.train.batch(np.arange(len(split.train)))
    assert x.shape == y.shape == (len(split.train), 16)
    assert torch.equal(x[:, 1:], y[:, :-1])  # the targets are the inputs shifted by one
    # every window lies inside its own work
    lengths = np.array([len((corpus / "shakespeare" / f"{w}{SUFFIX}").read_text())
                        for w in split.train.works])
    ends = np.cumsum(lengths)
    work, starts = split.train.labels.numpy(), split.train.starts.numpy()
    assert np.all(starts >= (ends - lengths)[work]) and np.all(starts + 17 <= ends[work])
    text = split.vocabulary.decode(x[0].tolist())
    assert text == (corpus / "shakespeare" / f"{split.train.works[0]}{SUFFIX}").read_text()[:16]


def test_vocabulary_is_the_training_texts_and_unknown_characters_map_to_one_symbol():
    vocab = Vocabulary.of(["abc", "cab "])
    assert vocab.chars == " abc" and len(vocab) == 5
    ids, unknown = vocab.encode("a bz")
    assert unknown == 1 and ids.tolist() == [2, 1, 3, 0]
    assert vocab.decode(ids.tolist()) == "a b\ufffd"


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"  \n\n", "is empty"),
    (b"caf\xe9 au lait", "is not UTF-8 text (byte 3"),
    (b"PK\x03\x04\x00\x00binary", "holds NUL bytes"),
])
def test_reader_names_a_bad_file(corpus, content, message):
    bad = corpus / "shakespeare" / f"play_1{SUFFIX}"
    bad.write_bytes(content)
    with pytest.raises(DataFormatError, match=re.escape(message)) as err:
        load_shakespeare(str(corpus))
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_reader_names_a_missing_held_out_play_and_an_empty_folder(corpus, tmp_path):
    (corpus / "shakespeare" / f"macbeth{SUFFIX}").unlink()
    with pytest.raises(DataFormatError, match=f"lacks the held-out play macbeth{SUFFIX}"):
        load_shakespeare(str(corpus))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataNotFoundError, match=rf"no \*{SUFFIX} file") as err:
        load_shakespeare(str(tmp_path / "empty"))
    assert "setup.sh" in str(err.value)


# ---------------------------------------------------------------------- partitions
@pytest.mark.parametrize("kind", ["iid", "group", "dirichlet", "class"])
def test_partitions_give_every_character_to_at_most_one_worker(corpus, kind):
    split = load_shakespeare(str(corpus), context=16)
    shards = partition(kind, split.train.labels, 3, seed=1)
    targets = [set((split.train.starts[s, None] + torch.arange(1, 17)).flatten().tolist())
               for s in shards]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not targets[i] & targets[j], (kind, i, j)
    if kind == "group":  # whole plays: each play's windows on one worker
        plays = [set(split.train.labels[s].tolist()) for s in shards]
        assert sum(map(len, plays)) == len(split.train.works)
        assert sum(map(len, shards)) == len(split.train)
        sizes = [len(s) for s in shards]
        largest = int(torch.bincount(split.train.labels).max())
        assert max(sizes) - min(sizes) <= largest


def test_group_partition_needs_a_group_per_worker():
    with pytest.raises(ValueError, match="more than the 2 groups"):
        partition("group", [0, 0, 1, 1, 1], 3, seed=0)


# ---------------------------------------------------------------------- the model
def test_gpt_char_has_nanogpts_parameter_count_and_is_causal():
    torch.manual_seed(0)
    model = build_model("gpt-char", (64,), 85)
    block = 128 + 3 * 128 * 128 + 128 * 128 + 128 + 2 * 4 * 128 * 128  # norms, attention, MLP
    assert count_parameters(model) == 85 * 128 + 64 * 128 + 4 * block + 128  # head tied
    x = torch.randint(85, (2, 10))
    out = model(x)
    assert out.shape == (2, 85, 10)  # class-second, as cross_entropy takes a sequence
    changed = x.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 85
    torch.testing.assert_close(model(changed)[:, :, :6], out[:, :, :6])  # no peeking ahead
    with pytest.raises(ValueError, match="longer than its context 64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_gpt_char_learns_a_tiny_corpus(corpus):
    split = load_shakespeare(str(corpus), context=16)
    torch.manual_seed(0)
    model = build_model("gpt-char", (16,), split.num_classes, n_layer=1, n_head=2, n_embd=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(150):
        x, y = split.train.batch(torch.randint(len(split.train), (16,), generator=g))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 0.9 * math.log(split.num_classes)  # starts near uniform
    assert sum(losses[-10:]) / 10 < 0.6 * losses[0], (losses[0], losses[-10:])


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize("changes, message", [
    ({"network": "lenet"}, "-n/--network: invalid value 'lenet'; expected a model of text "
                           "for --dataset shakespeare: gpt-char"),
    ({"n_embd": 30}, "--n-embd: invalid value 30; expected a multiple of --n-head 4"),
    ({"n_layer": 0}, "--n-layer: invalid value 0; expected an integer in 1..65536"),
])
def test_text_runs_refuse_a_model_that_does_not_fit(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config(**{"dataset": "shakespeare", "network": "gpt-char", **changes}).validate()


def test_image_runs_refuse_the_text_models_flags():
    with pytest.raises(ConfigError, match="--n-layer: invalid value 6; expected 4 .unchanged."):
        Config(n_layer=6).validate()
    with pytest.raises(ConfigError, match="expected a model of images for --dataset "
                                          "fashion-mnist: mlp, lenet"):
        Config(network="gpt-char").validate()


# ---------------------------------------------------------------------- loss as the figure
def test_time_to_target_of_a_loss_is_the_first_evaluation_at_or_below_it():
    evals = [{"train_time": t, "test_loss": v, "test_acc": 0.0}
             for t, v in ((0, 4.4), (5, 2.5), (10, 2.0), (15, 2.1), (20, 1.9))]
    assert time_to_target(evals, (2.5, 2.0, 1.95, 1.5), LOSS) == {
        "2.5": 5.0, "2.0": 10.0, "1.95": 20.0, "1.5": None}


# ---------------------------------------------------------------------- a run end to end
TEXT_RUN = dict(dataset="shakespeare", network="gpt-char", context=16, n_layer=1, n_head=2,
                n_embd=32, batch_size=16, optimizer="adamw", lr=3e-3, workers=2,
                slowdowns=(1.0, 2.0), epochs=None, eval_interval=1.0, timeout=60.0)


@pytest.mark.slow
def test_diloco_with_adamw_trains_the_transformer_and_its_checkpoint_keeps_adamws_state(corpus, tmp_path):
    # (averaging, outer rate 1 and no momentum: DiLoCo's outer Nesterov starts slowly, and
    # a few seconds of it say little)
    cfg = Config(mode="diloco", data_dir=str(corpus), log_dir=str(tmp_path / "runs"),
                 time_budget=6.0, checkpoint_every=1,
                 options={"global_lr": 1.0, "outer_momentum": 0.0}, **TEXT_RUN)
    run_dir = launch(cfg, show_progress=False, figures=True, stream=open(os.devnull, "w"))
    s = summarize(run_dir)
    assert s["metric"] == "test_loss" and s["complete"]
    evals = [json.loads(l) for l in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert evals[0]["test_loss"] > 0.9 * math.log(12)  # about uniform over the few symbols
    assert s["final_loss"] < 0.7 * evals[0]["test_loss"], (evals[0], s["final_loss"])
    assert list(s["time_to_target"]) == ["2.2", "2.0", "1.9", "1.8"]
    assert (run_dir / "figures" / "loss.png").exists()
    # every worker's last checkpoint holds AdamW's moments, after many steps of it
    index = checkpoint.indices(run_dir)[-1]
    for rank in (0, 1):
        state = checkpoint.load(checkpoint.file_of(run_dir, index, rank))["optimizer"]["state"]
        assert state and all({"exp_avg", "exp_avg_sq"} <= set(p) for p in state.values())
        assert float(state[0]["step"]) > 8  # more than one round's inner steps: kept


@pytest.mark.slow
def test_target_loss_stops_a_text_run(corpus, tmp_path):
    cfg = Config(mode="sync", data_dir=str(corpus), log_dir=str(tmp_path / "runs"),
                 time_budget=60.0, target_loss=2.3, partition="group", **TEXT_RUN)
    run_dir = launch(cfg, show_progress=False, figures=False, stream=open(os.devnull, "w"))
    s = summarize(run_dir, targets=(2.3,))
    assert s["final_loss"] <= 2.3 and s["wall_s"] < 55
    assert s["time_to_target"]["2.3"] is not None
