"""fprune.oneshot.prune_pretrained: a checkpoint pruned block by block into a new one equals the
in-memory prune(inplace=True), loads and generates; bad input refused before anything is
written; a failed write leaves no loadable output; memory flat in depth."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import fprune
from fprune.oneshot import _checkpoint

transformers = pytest.importorskip("transformers")

VOCAB = 64
ROOT = pathlib.Path(__file__).resolve().parents[2]


def llama(layers=3, dtype=torch.float32):
    config = transformers.LlamaConfig(
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=32,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).to(dtype)


def gpt2(layers=3, dtype=torch.float32):
    config = transformers.GPT2Config(
        n_layer=layers, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config).to(dtype)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for name, build, dtype in (
        ("llama", llama, torch.float32),
        ("gpt2", gpt2, torch.float32),
        ("llama-bf16", llama, torch.bfloat16),
    ):
        torch.manual_seed(0)
        shard = "10KB" if dtype == torch.bfloat16 else "20KB"
        build(dtype=dtype).save_pretrained(root / name, max_shard_size=shard)
        out[name] = root / name
    return out


def batches(seed=0, n=2):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, VOCAB, (2, 8), generator=g)} for _ in range(n)]


def headers(directory):
    found = {}
    for file in sorted(directory.glob("*.safetensors")):
        found[file.name] = _checkpoint._header(file)[1]
    return found


CASES = {
    "sparsegpt": ({"method": "sparsegpt"}, 0.5),
    "wanda-2:4": ({"method": "wanda", "n_m": (2, 4)}, None),
    "owl": ({"method": "wanda", "profile": "owl"}, 0.5),
}


@pytest.mark.parametrize(
    "model, case, device",
    [
        ("llama", "sparsegpt", None),
        ("llama", "wanda-2:4", "cpu"),
        ("llama", "owl", None),
        ("gpt2", "sparsegpt", "cpu"),
        ("gpt2", "wanda-2:4", None),
        ("gpt2", "owl", None),
        ("llama-bf16", "sparsegpt", None),
    ],
)
def test_equals_prune_inplace_on_the_loaded_model(checkpoints, tmp_path, model, case, device):
    source = checkpoints[model]
    options, sparsity = CASES[case]
    assert len(list(source.glob("*.safetensors"))) > 1  # several shards
    out = fprune.oneshot.prune_pretrained(
        source, tmp_path / "out", batches(), sparsity, device=device, **options
    )
    assert out == tmp_path / "out"
    # the source's layout: the same shards, tensor -> shard map, dtypes, shapes and offsets
    assert headers(out) == headers(source)
    assert (out / _checkpoint.INDEX).read_bytes() == (source / _checkpoint.INDEX).read_bytes()
    assert (out / "generation_config.json").is_file() and not list(out.glob("*.partial"))
    dtype = torch.bfloat16 if model.endswith("bf16") else torch.float32
    want = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype).eval()
    fprune.oneshot.prune(
        want, dict(want.named_parameters()), batches(), sparsity, inplace=True, masks=None, **options
    )
    got = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=dtype)
    expected, written = want.state_dict(), got.state_dict()
    assert expected.keys() == written.keys()
    for k in expected:
        assert written[k].dtype == expected[k].dtype and torch.equal(written[k], expected[k]), k
    pruned = [k for k in expected if ".h.1." in k or ".layers.1." in k]
    assert any(float((expected[k] == 0).float().mean()) > 0.3 for k in pruned)  # OWL: about 0.5
    # every tensor outside the pruned weights is the source's, byte for byte
    selected = {k for k in expected if k.endswith(("proj.weight", "c_attn.weight", "c_fc.weight"))}
    src = _checkpoint.read(source)
    for key, entry in src.entries.items():
        if key not in selected and not key.endswith("c_proj.weight"):
            with open(source / entry.shard, "rb") as a, open(out / entry.shard, "rb") as b:
                a.seek(entry.start)
                b.seek(entry.start)
                assert a.read(entry.end - entry.start) == b.read(entry.end - entry.start), key
    ids = got.generate(batches()[0]["input_ids"], max_new_tokens=3, do_sample=False)
    assert ids.shape == (2, 11)


def test_one_shard_and_the_tokenizer_files_copied(tmp_path):
    torch.manual_seed(0)
    llama(layers=2).save_pretrained(tmp_path / "src")  # one model.safetensors, no index
    (tmp_path / "src" / "tokenizer_config.json").write_text("{}")
    out = fprune.oneshot.prune_pretrained(
        tmp_path / "src", tmp_path / "out", batches(), 0.5, method="magnitude"
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "src").iterdir())
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert float((model.model.layers[0].self_attn.q_proj.weight == 0).float().mean()) == 0.5


def test_group_device_and_profile_arguments(checkpoints, tmp_path):
    source = checkpoints["llama"]
    with pytest.raises(TypeError, match=r"Expected group to be a torch.distributed process group .*got str"):
        fprune.oneshot.prune_pretrained(source, tmp_path / "out", batches(), 0.5, group="ranks")
    with pytest.raises(ValueError, match=r"prune_pretrained: group=None names no process group"):
        fprune.oneshot.prune_pretrained(source, tmp_path / "out", batches(), 0.5, group=None)
    with pytest.raises(ValueError, match="Expected device to hold values, got 'meta'"):
        fprune.oneshot.prune_pretrained(source, tmp_path / "out", batches(), 0.5, device="meta")
    with pytest.raises(ValueError, match=r"Expected device to be None or a device.*'nowhere'"):
        fprune.oneshot.prune_pretrained(source, tmp_path / "out", batches(), 0.5, device="nowhere")

    def needs(weights, sparsity, *, blocks, norms):
        return dict.fromkeys(weights, sparsity)

    needs.needs_norms = True
    with pytest.raises(ValueError, match=r"needs input norms.*only OWL"):
        fprune.oneshot.prune_pretrained(source, tmp_path / "out", batches(), 0.5, profile=needs)
    with pytest.raises(ValueError, match="Expected sparsity to be a fraction"):
        fprune.oneshot.prune_pretrained(source, tmp_path / "out", batches(), 1.5)
    assert not (tmp_path / "out").exists()  # nothing written


def copy_checkpoint(source, target):
    target.mkdir()
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


def test_bad_sources_refused_before_anything_is_written(checkpoints, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(
        ValueError, match=r"Expected source to be a transformers checkpoint directory.*no such directory"
    ):
        fprune.oneshot.prune_pretrained(tmp_path / "nothing", out, batches(), 0.5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"checkpoint directory.*'.*empty': it has no config\.json"):
        fprune.oneshot.prune_pretrained(tmp_path / "empty", out, batches(), 0.5)
    broken = copy_checkpoint(checkpoints["llama"], tmp_path / "broken")
    shard = sorted(broken.glob("*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ValueError, match=rf"maps tensors to shard\(s\) '{shard.name}', which are not in"):
        fprune.oneshot.prune_pretrained(broken, out, batches(), 0.5)
    unlisted = copy_checkpoint(checkpoints["llama"], tmp_path / "unlisted")
    index = json.loads((unlisted / _checkpoint.INDEX).read_text())
    shard = index["weight_map"].pop("model.norm.weight")
    (unlisted / _checkpoint.INDEX).write_text(json.dumps(index))
    with pytest.raises(
        ValueError, match=rf"leaves out tensor\(s\) 'model\.norm\.weight' that shard '{shard}' holds"
    ):
        fprune.oneshot.prune_pretrained(unlisted, out, batches(), 0.5)
    index["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors"
    (unlisted / _checkpoint.INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"shard\(s\) 'model-00009-of-00009\.safetensors', which are not in"):
        fprune.oneshot.prune_pretrained(unlisted, out, batches(), 0.5)
    wider = copy_checkpoint(checkpoints["llama"], tmp_path / "wider")
    config = json.loads((wider / "config.json").read_text())
    config["intermediate_size"] = 48
    (wider / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"Tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' .*\(48, 16\)"):
        fprune.oneshot.prune_pretrained(wider, out, batches(), 0.5)
    assert not out.exists()


def test_an_output_that_holds_files_is_refused_unless_overwrite(checkpoints, tmp_path):
    source = checkpoints["llama"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(
        ValueError, match=r"new or empty directory, got .* which holds 'notes\.txt'; pass overwrite=True"
    ):
        fprune.oneshot.prune_pretrained(source, out, batches(), 0.5, method="magnitude")
    with pytest.raises(ValueError, match="another directory than source"):
        fprune.oneshot.prune_pretrained(source, source, batches(), 0.5, method="magnitude", overwrite=True)
    with pytest.raises(TypeError, match="Expected overwrite to be a bool, got 1"):
        fprune.oneshot.prune_pretrained(source, out, batches(), 0.5, overwrite=1)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    fprune.oneshot.prune_pretrained(source, out, batches(), 0.5, method="magnitude", overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "config.json").is_file()
    transformers.AutoModelForCausalLM.from_pretrained(out)


def test_a_full_disk_leaves_the_output_clearly_incomplete(checkpoints, tmp_path, monkeypatch):
    source = checkpoints["llama"]
    real = _checkpoint.write_at
    written = [0]

    def fills_up(fd, data, offset):
        size = memoryview(data).nbytes
        if written[0] + size > 20_000:  # about half the shards' bytes
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written[0] += size
        real(fd, data, offset)

    monkeypatch.setattr(_checkpoint, "write_at", fills_up)
    out = tmp_path / "out"
    with pytest.raises(OSError) as caught:
        fprune.oneshot.prune_pretrained(source, out, batches(), 0.5)
    total = sum(f.stat().st_size for f in source.glob("*.safetensors"))
    assert caught.value.errno == errno.ENOSPC and 0 < written[0] < total / 2
    assert not (out / "config.json").exists() and not list(out.glob("*.safetensors*"))
    with pytest.raises((OSError, ValueError)):  # no config.json: "Unrecognized model"
        transformers.AutoModelForCausalLM.from_pretrained(out)


MEMORY = """
import sys, pathlib, torch, fprune

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

source, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
g = torch.Generator().manual_seed(0)
batches = [{"input_ids": torch.randint(0, 256, (1, 32), generator=g)} for i in range(2)]
samples = []


def sample(report):
    if report.phase == "prune":
        samples.append(anon())


fprune.oneshot.prune_pretrained(source, out, batches, 0.5, method="wanda", progress=sample)
print(samples)
"""


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_memory_does_not_grow_with_depth(tmp_path):
    # A 16-block Llama with 2.6 MB blocks: the process's anonymous memory after each block,
    # sampled in a fresh process, is as high after block 15 as after block 3 (one block more
    # would be 2.6 MB; keeping every block, 42 MB).
    config = transformers.LlamaConfig(
        num_hidden_layers=16,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        vocab_size=256,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path / "src", max_shard_size="8MB")
    block = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    del model
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", MEMORY, str(tmp_path / "src"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    samples = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(samples) == 16
    assert max(samples[8:]) - max(samples[:8]) < block / 2, (samples, block)
