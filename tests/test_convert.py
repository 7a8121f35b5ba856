"""Converters across notebooks: tokenizers against transformers', dalle-mini round trips, min-dalle → ours → dalle-mini
key for key, bad input, and `dalle-nb convert` + `dalle-nb generate --model` run as a user would."""
import json, os, pickle, shutil, subprocess, sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from conftest import cli_cache

from dalle_nb.config import BartConfig, VQGANConfig, CLIPConfig, RunConfig
from dalle_nb.text import bart_tokenizer, clip_tokenizer, train_tokenizer, TextEncoder, SPECIAL_TOKENS
from dalle_nb.bart import DalleBart
from dalle_nb.vqgan import VQGAN
from dalle_nb.clip import CLIP
from dalle_nb.weights import _flat_params
from dalle_nb.modeldir import Models, load_models
from dalle_nb.convert import (ConvertError, build_model, model_shapes, bart_to_dalle_mini, bart_from_dalle_mini,
                              bart_config_from_dalle_mini, save_flax, read_flax, read_json, read_torch, read_safetensors,
                              bart_from_min_dalle, vqgan_to_flax)
from dalle_nb.published import save_dalle_mini, save_transformers_clip, convert, load_dalle_mini, load_min_dalle

EXE = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))
CAPTIONS = ["a red circle", "a blue square above a green triangle", "a small yellow triangle", "a large cyan circle",
            "it's a dog, isn't it?", "3.5 cats and 12 dogs"] * 5
SMALL = BartConfig(text_vocab=300, image_codes=64, image_vocab=64, max_text_len=12, image_len=256, d_model=32,
                   encoder_layers=1, decoder_layers=2, heads=4, glu_dim=48)


def random_params(cls, cfg, seed=0, unit_scales=True) -> dict:
    rng = np.random.default_rng(seed)
    return {k: np.ones(s, np.float32) if unit_scales and k.endswith("scale") else rng.normal(0, 0.1, s).astype(np.float32)
            for k, s in model_shapes(cls, cfg).items()}


def random_model(cls, cfg, seed=0, unit_scales=True):
    return build_model(cls, cfg, random_params(cls, cfg, seed, unit_scales), "random")


def same(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a: np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def write_clip_vocab(d: Path, size: int):
    "A CLIP-format vocab.json/merges.txt of exactly `size` ids: bytes, their `</w>` forms, merges, fillers, then the specials."
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [("c", "a"), ("ca", "t</w>"), ("d", "o"), ("do", "g</w>"), ("i", "t"), ("'", "s</w>")]
    toks = alphabet + [c + "</w>" for c in alphabet] + [a + b for a, b in merges]
    toks += [f"x{i}</w>" for i in range(size - len(toks) - 2)] + ["<|startoftext|>", "<|endoftext|>"]
    d.mkdir(parents=True, exist_ok=True)
    (d / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(toks)}))
    (d / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return d / "vocab.json", d / "merges.txt"


def bart_files(d: Path, vocab_size=300):
    "BART-format vocab.json + merges.txt of a BPE trained on CAPTIONS (`<s> <pad> </s> <unk>` = 0..3)."
    d.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(CAPTIONS, vocab_size=vocab_size)
    tok.model.save(str(d))
    return d / "vocab.json", d / "merges.txt"


# ---------------------------------------------------------------- tokenizers

TEXTS = [" a red circle", "a red circle", " it's a dog, isn't it?", "  Multiple   SPACES\tand\nlines ", " 3.5 cats",
         " Ünïcödé 北京 🙂", "", " cat" * 40]


def test_bart_tokenizer_matches_transformers(tmp_path):
    from transformers import BartTokenizerFast
    v, m = bart_files(tmp_path)
    theirs = BartTokenizerFast(vocab=str(v), merges=str(m))
    ours = TextEncoder(bart_tokenizer(v, m), max_len=16, normalizer="none")
    assert [e.ids for e in ours.tokenizer.encode_batch(TEXTS)] == theirs(TEXTS)["input_ids"]
    padded = theirs(TEXTS, padding="max_length", truncation=True, max_length=16)["input_ids"]
    assert ours(TEXTS).tolist() == padded                                  # padding and truncation too (</s> kept last)


def test_clip_tokenizer_matches_transformers(tmp_path):
    from transformers import CLIPTokenizer
    v, m = write_clip_vocab(tmp_path, 600)
    theirs = CLIPTokenizer(vocab=str(v), merges=str(m))
    ours = TextEncoder(clip_tokenizer(v, m), max_len=12, normalizer="none")
    texts = ["A CAT", "it's a dog's cat!", "cat,dog  cat 42", "ÇAT 🙂", ""]
    assert [e.ids for e in ours.tokenizer.encode_batch(texts)] == theirs(texts)["input_ids"]
    assert ours(texts).tolist() == theirs(texts, padding="max_length", truncation=True, max_length=12)["input_ids"]


# ---------------------------------------------------------------- dalle-mini layout round trips

@pytest.mark.parametrize("scanned", [True, False])
@pytest.mark.parametrize("unit_scales, use_bias", [(True, False), (False, True)])
def test_dalle_mini_msgpack_round_trips_exactly(tmp_path, scanned, unit_scales, use_bias):
    cfg = replace(SMALL, use_bias=use_bias)
    bart = random_model(DalleBart, cfg, unit_scales=unit_scales)
    flat, config = bart_to_dalle_mini(bart, scanned=scanned)
    assert config["force_ln_scale"] == (not unit_scales)                  # trained scales are kept, never dropped
    assert any("FlaxBartEncoderLayers" in k for k in flat) == scanned
    save_flax(tmp_path, flat, config)
    back_cfg = bart_config_from_dalle_mini(read_json(tmp_path / "config.json"), image_codes=cfg.image_codes)
    assert replace(back_cfg, text_normalizer=cfg.text_normalizer) == cfg
    same(bart_from_dalle_mini(read_flax(tmp_path / "flax_model.msgpack"), back_cfg), _flat_params(bart))


def test_vqgan_flax_round_trips_exactly(tmp_path):
    cfg = VQGANConfig(resolution=16, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, attn_resolutions=(4,), z_channels=8,
                      embed_dim=4, n_embed=32, norm_groups=4)
    vq = random_model(VQGAN, cfg, unit_scales=False)
    save_flax(tmp_path, *vqgan_to_flax(vq))
    from dalle_nb.published import load_vqgan_flax
    back = load_vqgan_flax(tmp_path)
    assert back.cfg == cfg
    same(_flat_params(back), _flat_params(vq))


# ---------------------------------------------------------------- min-dalle → ours → dalle-mini, key for key

FLAX_OF_TORCH = {"pre_self_attn_layer_norm": "LayerNorm_0", "self_attn_layer_norm": "LayerNorm_1",
                 "pre_encoder_attn_layer_norm": "LayerNorm_2", "encoder_attn_layer_norm": "LayerNorm_3",
                 "self_attn": "FlaxBartAttention_0", "encoder_attn": "FlaxBartAttention_1", "glu.ln0": "GLU_0/LayerNorm_0",
                 "glu.ln1": "GLU_0/LayerNorm_1", "glu.fc0": "GLU_0/Dense_0", "glu.fc1": "GLU_0/Dense_1", "glu.fc2": "GLU_0/Dense_2"}
NO_SCALE = ("pre_self_attn_layer_norm.weight", "pre_encoder_attn_layer_norm.weight", "glu.ln0.weight", "glu.ln1.weight", "final_ln.weight")


def expected_flax(enc: dict, dec: dict, force_scale: bool) -> dict:
    """The dalle-mini msgpack that min-dalle's published .pt files were converted from, rebuilt from the .pt tensors
    by inverting min-dalle's own conversion (its `load_params.py`): written here independently of dalle_nb.convert."""
    out, layers = {}, {}
    for side, sd in (("encoder", enc), ("decoder", dec)):
        for k, v in sd.items():
            if not force_scale and k.endswith(NO_SCALE): continue
            leaf = k.rsplit(".", 1)[1]
            is_norm = "norm" in k or ".ln" in k or k.startswith("final_ln")
            flax_leaf = {"weight": "scale" if is_norm else ("embedding" if k.startswith("embed") else "kernel")}.get(leaf, leaf)
            value = v.T if flax_leaf == "kernel" else v
            if k == "lm_head.weight": out["lm_head/kernel"] = value; continue
            if k.startswith("layers."):
                _, i, rest = k.split(".", 2)
                sub = rest.rsplit(".", 1)[0]
                sub = FLAX_OF_TORCH.get(sub) or FLAX_OF_TORCH[sub.rsplit(".", 1)[0]] + "/" + sub.rsplit(".", 1)[1]
                name = f"model/{side}/layers/FlaxBart{side.title()}Layers/{sub}/{flax_leaf}"
                layers.setdefault(name, {})[int(i)] = value
            else:
                out[f"model/{side}/{k.rsplit('.', 1)[0]}/{flax_leaf}"] = value
    out.update({k: np.stack([g[i] for i in range(len(g))]) for k, g in layers.items()})
    return out


@pytest.mark.parametrize("published_like", [False, True])
def test_min_dalle_to_ours_to_dalle_mini_key_for_key(tmp_path, published_like):
    torch = pytest.importorskip("torch")
    from min_dalle.models import DalleBartEncoder, DalleBartDecoder
    torch.manual_seed(0)
    enc = DalleBartEncoder(layer_count=1, embed_count=32, attention_head_count=4, text_vocab_count=300, text_token_count=12,
                           glu_embed_count=48, device="cpu")
    dec = DalleBartDecoder(image_vocab_count=64, embed_count=32, attention_head_count=4, glu_embed_count=48, layer_count=2, device="cpu")
    with torch.no_grad():
        for mod in (enc, dec):
            for name, p in mod.named_parameters():
                if name.endswith(NO_SCALE): p.fill_(1.0) if published_like else p.normal_(1.0, 0.2)
                elif name.endswith("bias") or "norm" in name or ".ln" in name: p.normal_(0.5, 0.2)
    enc_sd, dec_sd = enc.state_dict(), dec.state_dict()
    if published_like:   # the published files lack the scale-less norms' weights (min-dalle loads with strict=False)
        enc_sd = {k: v for k, v in enc_sd.items() if not k.endswith(NO_SCALE)}
        dec_sd = {k: v for k, v in dec_sd.items() if not k.endswith(NO_SCALE)}
    torch.save(enc_sd, tmp_path / "encoder.pt"); torch.save(dec_sd, tmp_path / "decoder.pt")
    enc_np, dec_np = read_torch(tmp_path / "encoder.pt"), read_torch(tmp_path / "decoder.pt")
    ours = build_model(DalleBart, SMALL, bart_from_min_dalle(enc_np, dec_np, SMALL), tmp_path)
    flat, config = bart_to_dalle_mini(ours, scanned=True)
    assert config["force_ln_scale"] == (not published_like)
    same(flat, expected_flax(enc_np, dec_np, force_scale=not published_like))


def test_min_dalle_folder_converts_to_a_model_directory(tmp_path):
    torch = pytest.importorskip("torch")
    from min_dalle.models import DalleBartEncoder, DalleBartDecoder
    from dalle_nb.convert import min_dalle_state
    torch.manual_seed(1)
    enc = DalleBartEncoder(layer_count=1, embed_count=32, attention_head_count=4, text_vocab_count=300, text_token_count=12,
                           glu_embed_count=48, device="cpu")
    dec = DalleBartDecoder(image_vocab_count=64, embed_count=32, attention_head_count=4, glu_embed_count=48, layer_count=2, device="cpu")
    d = tmp_path / "dalle_bart_small"; d.mkdir()
    torch.save({k: v for k, v in enc.state_dict().items() if not k.endswith(NO_SCALE)}, d / "encoder.pt")   # as published
    torch.save(dec.state_dict(), d / "decoder.pt")
    bart_files(d)
    vq_cfg = VQGANConfig(resolution=32, ch=8, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(16,), z_channels=8,
                         embed_dim=4, n_embed=64, norm_groups=4)                # 16×16 = 256 codes, min-dalle's image length
    save_flax(tmp_path / "vqgan", *vqgan_to_flax(random_model(VQGAN, vq_cfg)))
    m = load_models(convert("min-dalle", d, tmp_path / "model", vqgan=tmp_path / "vqgan", heads=4))
    assert m.cfg.bart == replace(SMALL, text_normalizer="dalle_mini") and m.clip is None and m.cfg.sample.rerank == 0
    for ours, theirs in zip(min_dalle_state(m.bart), (enc.state_dict(), dec.state_dict())):
        same(ours, {k: v.numpy() for k, v in theirs.items()})
    assert "min-dalle layout" in m.card and m.text(["A Cat!"])[0, 0] == 0


# ---------------------------------------------------------------- bad input

def dalle_mini_set(d: Path, seed=0, clip=True) -> dict:
    "A complete dalle-mini-layout set (random weights): BART folder with tokenizer, VQGAN folder, CLIP folder."
    v, m = bart_files(d / "dalle")
    text = TextEncoder(bart_tokenizer(v, m), max_len=12)
    vq_cfg = VQGANConfig(resolution=16, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, attn_resolutions=(4,), z_channels=8,
                         embed_dim=4, n_embed=64, norm_groups=4)                # 4×4 tokens: sampling compiles quickly
    clip_cfg = CLIPConfig(embed_dim=16, image_size=16, patch_size=4, vision_width=32, vision_layers=1, vision_heads=4,
                          vision_mlp=64, text_vocab=600, text_len=12, text_width=32, text_layers=1, text_heads=4, text_mlp=64,
                          pad_id=599, eos_id=599)
    cfg = RunConfig(name="set", vqgan=vq_cfg, bart=replace(SMALL, text_vocab=text.vocab_size, image_len=16), clip=clip_cfg)
    models = Models(cfg, text, random_model(VQGAN, vq_cfg, seed), random_model(DalleBart, cfg.bart, seed), random_model(CLIP, clip_cfg, seed))
    save_dalle_mini(d / "dalle", models)
    save_flax(d / "vqgan", *vqgan_to_flax(models.vqgan))
    if clip:
        save_transformers_clip(d / "clip", models.clip)
        write_clip_vocab(d / "clip", 600)
    return {"dalle": d / "dalle", "vqgan": d / "vqgan", "clip": d / "clip", "models": models}


def test_wrong_model_size_truncated_files_and_vocab(tmp_path):
    s = dalle_mini_set(tmp_path, clip=False)
    conf = json.loads((s["dalle"] / "config.json").read_text())
    (s["dalle"] / "config.json").write_text(json.dumps({**conf, "d_model": 64, "encoder_ffn_dim": 96, "decoder_ffn_dim": 96}))
    with pytest.raises(ConvertError, match=r"flax_model.msgpack: does not fit the BART of its config \(d_model=64.*\n  tensor model/"):
        load_dalle_mini(s["dalle"], s["vqgan"])
    (s["dalle"] / "config.json").write_text(json.dumps(conf))
    data = (s["vqgan"] / "flax_model.msgpack").read_bytes()
    (s["vqgan"] / "flax_model.msgpack").write_bytes(data[:-100])
    with pytest.raises(ConvertError, match="vqgan/flax_model.msgpack: not a readable msgpack"):
        load_dalle_mini(s["dalle"], s["vqgan"])
    (s["vqgan"] / "flax_model.msgpack").write_bytes(data)
    vocab = json.loads((s["dalle"] / "vocab.json").read_text())
    (s["dalle"] / "vocab.json").write_text(json.dumps({**vocab, **{f"w{i}": len(vocab) + i for i in range(50)}}))
    with pytest.raises(ConvertError, match="vocab.json: 350 tokens, but the model embeds only 300 text ids"):
        load_dalle_mini(s["dalle"], s["vqgan"])
    (s["dalle"] / "vocab.json").write_text(json.dumps(vocab))
    (s["dalle"] / "vocab.json").write_text(json.dumps({("<PAD>" if k == "<pad>" else k): v for k, v in vocab.items()}))
    with pytest.raises(ConvertError, match=r"vocab.json: special token\(s\) \['<pad>'\] missing"):
        load_dalle_mini(s["dalle"], s["vqgan"])


def test_bad_torch_and_safetensors_files(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(3)}, tmp_path / "ok.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "ok.pt").read_bytes()[:-40])
    with pytest.raises(ConvertError, match="cut.pt: not a readable PyTorch weights file"): read_torch(tmp_path / "cut.pt")
    with open(tmp_path / "code.pt", "wb") as f: pickle.dump({"w": Path("/etc/passwd")}, f)   # an object, not a tensor
    with pytest.raises(ConvertError, match="code.pt: not a readable PyTorch weights file"): read_torch(tmp_path / "code.pt")
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    with pytest.raises(ConvertError, match="expected a state_dict"): read_torch(tmp_path / "list.pt")
    from safetensors.numpy import save_file
    save_file({"w": np.ones(3, np.float32)}, str(tmp_path / "m.safetensors"))
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "m.safetensors").read_bytes()[:30])
    with pytest.raises(ConvertError, match="cut.safetensors: not a readable safetensors file"): read_safetensors(tmp_path / "cut.safetensors")
    monkeypatch.setitem(sys.modules, "torch", None)                          # as on a machine without torch
    with pytest.raises(ConvertError, match=r"ok.pt: reading PyTorch .pt files needs torch \(pip install torch\)"): read_torch(tmp_path / "ok.pt")


def test_min_dalle_wrong_size_names_the_file(tmp_path):
    torch = pytest.importorskip("torch")
    from min_dalle.models import DalleBartEncoder, DalleBartDecoder
    enc = DalleBartEncoder(layer_count=1, embed_count=32, attention_head_count=4, text_vocab_count=300, text_token_count=12,
                           glu_embed_count=48, device="cpu")
    dec = DalleBartDecoder(image_vocab_count=64, embed_count=64, attention_head_count=4, glu_embed_count=48, layer_count=2, device="cpu")
    d = tmp_path / "md"; d.mkdir()
    torch.save(enc.state_dict(), d / "encoder.pt"); torch.save(dec.state_dict(), d / "decoder.pt")
    shutil.copy(bart_files(tmp_path / "tok")[0], d / "vocab.json"); shutil.copy(tmp_path / "tok" / "merges.txt", d / "merges.txt")
    s = dalle_mini_set(tmp_path / "set", clip=False)
    with pytest.raises(ConvertError, match=r"(?s)decoder.pt: does not fit a BART with d_model=32.*tensor embed_tokens.weight: file has shape \(65, 64\), expected \(65, 32\)"):
        load_min_dalle(d, vqgan=s["vqgan"], heads=4)
    with pytest.raises(ConvertError, match="d_model=32 is neither DALL·E Mini's"):
        load_min_dalle(d, vqgan=s["vqgan"])
    with pytest.raises(ConvertError, match="no detoker.pt here or in ../vqgan"):
        load_min_dalle(d, heads=4)
    out = tmp_path / "never"
    with pytest.raises(ConvertError): convert("min-dalle", d, out, vqgan=s["vqgan"], heads=4)
    assert not out.exists()                                                  # nothing half-written


# ---------------------------------------------------------------- the CLI, as a user runs it

def run(*args, cwd):
    env = {**os.environ, "DALLE_NB_CACHE": cli_cache(cwd)}
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_cli_convert_then_generate(tmp_path):
    s = dalle_mini_set(tmp_path / "published")
    r = run("convert", "--from", "dalle-mini", str(s["dalle"]), "--vqgan", str(s["vqgan"]), "--clip", str(s["clip"]),
            "--out", str(tmp_path / "model"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "model directory:" in r.stdout
    m = load_models(tmp_path / "model")
    same(_flat_params(m.bart), _flat_params(s["models"].bart))
    assert m.clip_text is not None and m.cfg.bart.text_normalizer == "none" and m.cfg.vqgan == s["models"].cfg.vqgan
    r = run("generate", "a red circle", "--model", str(tmp_path / "model"), "--n", "2", "--rerank", "1", "--cond-scale", "3",
            "--out", str(tmp_path / "images"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert len(names) == 2 and names[1] == "grid.png" and names[0].startswith("a-red-circle_seed0_"), names
    assert np.asarray(Image.open(tmp_path / "images" / names[0])).shape == (16, 16, 3)
    assert "clip scores" in r.stdout
    # user mistakes: one line, exit status 2, nothing written
    for args, msg in [(["--from", "dalle-mini", str(s["dalle"]), "--out", str(tmp_path / "m2")], "needs --vqgan DIR"),
                      (["--from", "dalle-mini", str(s["dalle"]), "--vqgan", str(s["dalle"]), "--out", str(tmp_path / "m3")],
                       "does not fit a VQGAN"),
                      (["--from", "dalle-mini", str(s["dalle"]), "--vqgan", str(s["vqgan"]), "--out", str(tmp_path / "model")],
                       "exists and is not an empty directory")]:
        r = run("convert", *args, cwd=tmp_path)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
    assert not (tmp_path / "m2").exists() and not (tmp_path / "m3").exists()
