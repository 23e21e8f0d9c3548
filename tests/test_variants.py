"""Every residual variant: finite, causal, structured as its description says, and trainable."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from attnres.config import ResidualSpec
from attnres.errors import AttnresError
from attnres.model.gpt import GPT
from attnres.model.residual import DepthAttention
from attnres.variants.registry import VARIANTS, get_variant, resolve_run

SMALL = ["vocab_size=97", "d_model=32", "n_head=2", "seq_len=16"]


def tiny(variant: str, n_layer: int = 7, extra: list[str] | None = None) -> GPT:
    torch.manual_seed(0)
    cfg = resolve_run(variant, "tiny", 0, [*SMALL, f"n_layer={n_layer}", *(extra or [])])
    return GPT(cfg.model)


def depth_module(model: GPT) -> DepthAttention:
    assert isinstance(model.residual, DepthAttention)
    return model.residual


def record(model: GPT, idx: torch.Tensor) -> list:
    res = depth_module(model)
    res.record = True
    with torch.no_grad():
        model(idx)
    res.record = False
    return res.records


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_forward_backward_is_finite(name):
    model = tiny(name)
    idx = torch.randint(0, 97, (2, 16))
    _, loss = model(idx, idx.roll(-1, 1))
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_changing_a_future_token_never_changes_an_earlier_position(name):
    model = tiny(name)
    # Make the depth attention non-uniform so that a leak through depth mixing would show.
    for p in model.residual.parameters():
        with torch.no_grad():
            p.add_(torch.randn_like(p) * 0.5)
    idx = torch.randint(0, 97, (1, 16))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 5) % 97
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_control_block_weights_at_step_0_are_uniform_over_its_sources():
    records = record(tiny("control_block", n_layer=7), torch.randint(0, 97, (2, 5)))
    assert len(records) == 8  # 7 layers + the final norm
    for r in records:
        i = r.site
        expected = 1 + i // 3 + (1 if i % 3 else 0)  # embedding + completed blocks + partial
        assert len(r.kinds) == expected
        assert r.kinds.count("block") == i // 3
        assert torch.allclose(r.weights, torch.full_like(r.weights, 1 / expected))


def test_control_block_summaries_are_means_of_three_layer_outputs():
    spec = get_variant("control_block").residual
    res = DepthAttention(spec, d_model=4, n_steps=7, eps=1e-6)
    res.record = True
    outs = [torch.full((1, 1, 4), float(i + 1)) for i in range(7)]
    res(torch.zeros(1, 1, 4), [lambda x, o=o: o for o in outs])
    final = res.records[-1]
    values = [float(v.flatten()[0]) for v in final.sources]
    assert final.kinds == ["embedding", "block", "block", "partial"]
    assert values == [0.0, 2.0, 5.0, 7.0]  # mean(1,2,3), mean(4,5,6), partial mean(7)


def test_full_attnres_attends_to_every_prior_output():
    for r in record(tiny("full_attnres", n_layer=5), torch.randint(0, 97, (1, 4))):
        assert len(r.kinds) == r.site + 1


def test_sparse_depth_attends_to_exactly_the_allowed_blocks():
    model = tiny("block_sparse_depth", n_layer=33)  # 11 blocks of 3
    for r in record(model, torch.randint(0, 97, (1, 4))):
        n = r.site // 3 + 1  # the site's own depth position
        allowed = {p for p in range(n) if n - p <= 4 or p % 4 == 0}
        got = [p for p, k in zip(r.positions, r.kinds, strict=True) if k != "partial"]
        assert sorted(got) == sorted(allowed)
        assert ("partial" in r.kinds) == (r.site % 3 != 0)
    last = depth_module(model).records[-1]
    assert sorted(p for p, k in zip(last.positions, last.kinds, strict=True) if k != "partial") == [0, 4, 8, 9, 10, 11]


def test_gqa_depth_shares_one_query_per_group_of_four_layers():
    model = tiny("block_gqa_depth", n_layer=8)
    res = depth_module(model)
    assert res.query.shape[0] == 3  # layers 0-3, layers 4-7, the final norm
    with torch.no_grad():
        res.query[0].normal_()
    idx = torch.randint(0, 97, (1, 6))
    records = record(model, idx)
    uniform = [torch.allclose(r.weights, torch.full_like(r.weights, 1 / len(r.kinds))) for r in records]
    # sites 0-3 use the perturbed query (site 0 has one source, so it is trivially uniform)
    assert uniform == [True, False, False, False, True, True, True, True, True]


def test_gqa_and_mqa_are_clean_ablations_of_control_block():
    """Each changes who owns the queries and nothing else: control_block's keys (a gain per layer) stay."""
    block = get_variant("control_block").residual
    assert replace(get_variant("block_gqa_depth").residual, query="site", query_group=1) == block
    assert replace(get_variant("block_mqa_depth").residual, query="site") == block
    assert replace(get_variant("block_source_gain").residual, key_gain="site") == block
    ref = depth_module(tiny("control_block", n_layer=9))
    for name, queries in (("block_gqa_depth", 4), ("block_mqa_depth", 1)):  # groups 0-3, 4-7, 8, readout
        res = depth_module(tiny(name, n_layer=9))
        assert res.query.shape[0] == queries and res.key_gain.shape == ref.key_gain.shape == (10, 32)


def test_source_gain_keys_belong_to_the_depth_position():
    """block_source_gain: one gain per source (embedding, block k), so sites score a source's keys alike."""
    model = tiny("block_source_gain", n_layer=9)
    res = depth_module(model)
    assert res.key_gain.shape[0] == res.n_pos == 4
    with torch.no_grad():
        for p in res.parameters():
            p.add_(torch.randn_like(p))
    u, _ = res._queries([3, 4, 5], 2, [0, 1], None)
    assert u.shape == (2, 3, 32)  # (source, site, d): the gain belongs to the source


def test_gqa_depth_has_four_times_fewer_query_parameters_than_control_block():
    counts = {}
    for name in ["control_block", "block_gqa_depth", "block_mqa_depth"]:
        with torch.device("meta"):
            counts[name] = GPT(resolve_run(name, "paper500m", 0).model).residual.param_counts()
    assert counts["block_gqa_depth"]["step queries"] * 4 == counts["control_block"]["step queries"] == 24 * 1536
    assert counts["block_gqa_depth"]["readout query"] == counts["control_block"]["readout query"] == 1536
    # the same keys: a gain per layer and one for the readout
    assert counts["block_gqa_depth"]["key gains"] == counts["block_mqa_depth"]["key gains"] == \
        counts["control_block"]["key gains"] == 25 * 1536


def test_hybrid_memory_window_holds_the_four_latest_outputs():
    spec = get_variant("block_hybrid_memory").residual
    res = DepthAttention(spec, d_model=3, n_steps=8, eps=1e-6)
    res.record = True
    outs = [torch.full((1, 1, 3), float(10 + i)) for i in range(8)]
    res(torch.zeros(1, 1, 3), [lambda x, o=o: o for o in outs])
    for r in res.records:
        window = [float(v.flatten()[0]) for v, k in zip(r.sources, r.kinds, strict=True) if k == "window"]
        assert window == [10.0 + j for j in range(r.site - 1, max(-1, r.site - 5), -1)]


def test_attnres_paper_at_step_0_is_the_plain_average_of_embedding_block_sums_and_partial():
    spec = get_variant("attnres_paper").residual
    n_steps = 16  # 8 layers x 2 sublayers -> 8 blocks of 2 sublayers
    res = DepthAttention(spec, d_model=6, n_steps=n_steps, eps=1e-6)
    assert res.block_size == 2
    torch.manual_seed(1)
    emb = torch.randn(2, 3, 6)
    weights = [torch.randn(6, 6) * 0.3 for _ in range(n_steps)]
    steps = [lambda x, w=w: torch.tanh(x @ w) for w in weights]
    out = res(emb, steps)
    # Reference: follow the paper by hand.
    blocks, partial, inputs = [], None, []
    for i in range(n_steps + 1):
        sources = [emb, *blocks] + ([partial] if partial is not None else [])
        x = torch.stack(sources).mean(0)
        inputs.append(x)
        if i == n_steps:
            break
        v = steps[i](x)
        partial = v if partial is None else partial + v
        if (i + 1) % 2 == 0:
            blocks.append(partial)
            partial = None
    assert torch.allclose(out, inputs[-1], atol=1e-6)


def test_attnres_paper_mixes_before_attention_mlp_and_final_norm():
    model = tiny("attnres_paper", n_layer=4)
    res = depth_module(model)
    assert res.n_sites == 2 * 4 + 1 and res.query.shape[0] == res.n_sites
    assert torch.count_nonzero(res.query) == 0


@pytest.mark.parametrize("name", ["block_alibi_depth", "block_input_dep_query", "block_value_proj",
                                  "block_rope_depth", "block_mqa_depth"])
def test_extra_components_start_at_the_uniform_average(name):
    for r in record(tiny(name, n_layer=7), torch.randint(0, 97, (2, 5))):
        assert torch.allclose(r.weights, torch.full_like(r.weights, 1 / len(r.kinds)))


def test_alibi_penalises_distant_blocks_once_its_slope_is_positive():
    model = tiny("block_alibi_depth", n_layer=9)
    with torch.no_grad():
        depth_module(model).alibi_slope.fill_(0.5)
    last = record(model, torch.randint(0, 97, (1, 3)))[-1]
    w = last.weights[:, 0, 0]
    assert all(w[i] < w[i + 1] for i in range(len(w) - 1))  # embedding (farthest) gets least


def test_input_dependent_query_varies_per_token():
    model = tiny("block_input_dep_query", n_layer=6)
    with torch.no_grad():
        depth_module(model).query_up.normal_()
    last = record(model, torch.randint(0, 97, (1, 6)))[-1]
    assert not torch.allclose(last.weights[:, 0, 0], last.weights[:, 0, 1])


def test_value_projection_touches_only_completed_block_summaries():
    spec = get_variant("block_value_proj").residual
    res = DepthAttention(spec, d_model=4, n_steps=4, eps=1e-6)
    with torch.no_grad():
        res.value_delta.copy_(torch.eye(4))  # values of blocks double
    outs = [torch.full((1, 1, 4), 3.0)] * 4
    out = res(torch.zeros(1, 1, 4), [lambda x, o=o: o for o in outs])
    # final site: embedding 0, block mean 3 -> projected 6, partial 3: uniform average = 3
    assert torch.allclose(out, torch.full((1, 1, 4), 3.0))


def test_deep_variants_match_the_parameter_count_of_the_24_layer_model():
    counts = {}
    for name in ["standard", "deep_baseline", "control_block", "deep_control_block", "deep_hybrid_memory"]:
        cfg = resolve_run(name, "paper500m", 0).model
        with torch.device("meta"):
            counts[name] = (cfg.n_layer, cfg.d_model, GPT(cfg).num_params()["total"])
    assert counts["standard"][:2] == (24, 1536) and counts["deep_baseline"][:2] == (48, 1080)
    base = counts["standard"][2]
    for _, _, total in counts.values():
        assert abs(total / base - 1) < 0.03


@pytest.mark.parametrize("deep", ["deep_baseline", "deep_control_block", "deep_hybrid_memory"])
def test_deep_variants_are_refused_on_a_preset_that_is_already_deep(deep):
    with pytest.raises(AttnresError, match=r"already deep .*use --preset paper500m"):
        resolve_run(deep, "deep48", 0)
    assert resolve_run(deep, "paper500m", 0).model.n_layer == 48
    assert resolve_run("control_block", "deep48", 0).model.n_layer == 48  # shallow variants are welcome


def test_rope_depth_scores_the_same_content_differently_by_depth_distance():
    """Paper width and depth: a source's logit falls well below the same content's at distance 0.

    Every layer outputs the same vector c and the embedding is c, so every source has the same
    content; the readout's query is c scaled to a logit of L at distance 0. With the token RoPE's
    base 10000 the logit stayed above 0.7 L at every distance of the model (most channel pairs
    hardly turn); with base = number of depth positions it falls below 0.5 L within a few blocks.
    """
    spec = get_variant("block_rope_depth").residual
    d, n_steps = 1536, 25  # 24 + 1 layers: the readout has blocks 1-8, the embedding and a partial
    res = DepthAttention(spec, d_model=d, n_steps=n_steps, eps=1e-6)
    torch.manual_seed(0)
    c = torch.randn(d)
    L = 4.0
    with torch.no_grad():
        res.query[-1] = c / c.norm() * L / math.sqrt(d)  # logit at distance 0: L (the keys have RMS 1)
    res.record = True
    res(c.view(1, 1, d), [lambda x: c.view(1, 1, d)] * n_steps)
    last = res.records[-1]
    site_pos = n_steps // 3 + 1
    logw = {site_pos - p: float(w.log()) for p, w in zip(last.positions, last.weights[:, 0, 0], strict=True)}
    assert sorted(logw) == list(range(site_pos + 1))  # distances 0 (partial) ... 9 (embedding)
    drop = {dist: (logw[0] - lw) / L for dist, lw in logw.items()}  # 1 - logit(dist) / logit(0)
    assert len({round(x, 6) for x in drop.values()}) == len(drop)  # every distance scores differently
    assert max(drop.values()) > 0.5
    assert drop[1] > 0.05 and drop[3] > 0.5


def test_aliases_and_unknown_names():
    assert get_variant("baseline_standard").name == "standard"
    with pytest.raises(AttnresError, match="did you mean 'control_block'"):
        get_variant("control_blok")


def byte_batches(seq: int, batch: int, steps: int) -> list[torch.Tensor]:
    """Real English (the built-in corpus) as bytes: a tiny vocabulary, so CPU steps are fast."""
    from attnres.data.corpus import builtin_documents

    text = " ".join(d.text for d in builtin_documents()).encode()
    data = torch.tensor(list(text[: seq * batch * steps + 1]), dtype=torch.long)
    return [data[i * seq * batch: (i + 1) * seq * batch + 1] for i in range(steps)]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_short_cpu_training_lowers_the_loss(name):
    torch.manual_seed(0)
    cfg = resolve_run(name, "tiny", 0, ["vocab_size=256", "d_model=32", "n_head=2", "seq_len=32", "n_layer=6"])
    model = GPT(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for chunk in byte_batches(32, 8, 40):
        x, y = chunk[:-1].view(8, 32), chunk[1:].view(8, 32)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert math.isfinite(losses[-1])
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0


def test_residual_spec_blocks_for_the_paper_is_steps_over_n_blocks():
    assert ResidualSpec(n_blocks=8).blocks_for(48) == 6
    assert ResidualSpec(block_size=3).blocks_for(48) == 3


def test_depth_variants_carry_a_revision_that_separates_their_runs_from_older_ones():
    """A run recorded before this revision is another cell; standard, unchanged, keeps its hash."""
    import json
    from dataclasses import replace

    from attnres.config import RunConfig

    std = resolve_run("standard", "tiny", 42)
    assert std.revision == 1 and "revision" not in json.loads(std.to_json())  # as recorded before revisions
    assert RunConfig.from_dict(json.loads(std.to_json())).config_hash == std.config_hash
    cb = resolve_run("control_block", "tiny", 42)
    older = replace(cb, revision=1)
    assert cb.revision == 2 and cb.config_hash != older.config_hash
    assert RunConfig.from_dict(json.loads(cb.to_json())) == cb
    from attnres.variants.registry import check_revision

    check_revision(cb, 1)
    with pytest.raises(AttnresError, match=r"revision 1 of control_block.*revision 2"):
        check_revision(older, 7)


@pytest.mark.integration
def test_resume_refuses_a_run_recorded_by_an_earlier_revision(workdir):
    from dataclasses import replace

    from helpers import cli_here

    from attnres.tracking import run_rows
    from attnres.tracking.db import get_engine

    engine = get_engine(str(workdir / "runs.db"))
    old = run_rows.create_run(engine, replace(resolve_run("control_block", "tiny", 42), revision=1), status="failed",
                           actor="importer")
    proc = cli_here("resume", str(old))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "revision 1 of control_block" in proc.stderr
    assert run_rows.get_run(engine, old).status == "failed"  # nothing recorded changed


def test_launching_a_deep_variant_on_deep48_is_one_line_and_exit_2(workdir):
    from helpers import cli_here

    proc = cli_here("launch", "deep_baseline", "--preset", "deep48", "--seeds", "1", "--dry-run")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "--preset paper500m" in proc.stderr
    ok = cli_here("launch", "deep_baseline", "--preset", "paper500m", "--seeds", "1", "--dry-run", check=True)
    assert "deep_baseline seed=1 preset=paper500m" in ok.stdout


def test_variants_params_at_deep48_lists_the_deep_variants_as_refused():
    from attnres.variants.describe import variant_rows

    rows = {r["variant"]: r for r in variant_rows("deep48")}
    assert rows["control_block"]["shape"].startswith("48L d1080 h")
    refused = [v for v, r in rows.items() if r["shape"] == "refused"]
    assert refused == ["deep_baseline", "deep_control_block", "deep_hybrid_memory"]
    assert all("use --preset paper500m" in rows[v]["total"] for v in refused)


@pytest.mark.integration
def test_resume_of_an_imported_run_is_one_line(workdir):
    from helpers import cli_here

    (workdir / "m.csv").write_text("variant,seed,step,key,value,status\nstandard,1,10,eval_loss,3.0,failed\n")
    cli_here("import", "m.csv", check=True)
    proc = cli_here("resume", "1")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "imported" in proc.stderr


@pytest.mark.parametrize("name", sorted(n for n, v in VARIANTS.items() if v.residual.kind == "depth"))
def test_the_source_plan_is_what_the_forward_attends_to(name):
    """`attnres variants` reads the plan; the forward must agree with it site by site."""
    model = tiny(name, n_layer=11)
    got = [list(zip(r.kinds, r.positions, strict=True)) for r in record(model, torch.randint(0, 97, (1, 3)))]
    assert got == depth_module(model).source_plan()


def test_cuda_runs_compile_unless_turned_off_and_recorded_runs_keep_their_hashes():
    """Compiling on CUDA by default changed no recorded run's hash (hashes from before the change);
    `--set compile=false` opts out, on CUDA too, and is a cell of its own."""
    import json

    from attnres.config import RunConfig
    from attnres.training.loop import compiles

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    default = resolve_run("standard", "tiny", 42)
    assert default.config_hash == "bb101efde3a5"  # as runs recorded before this change have it
    assert resolve_run("control_block", "paper500m", 7, ["compile=true"]).config_hash == "8f0fa7bffa2c"
    assert compiles(default.train, cuda) and not compiles(default.train, cpu)
    off = resolve_run("standard", "tiny", 42, ["compile=false"])
    assert not compiles(off.train, cuda) and off.config_hash != default.config_hash
    assert RunConfig.from_dict(json.loads(off.to_json())) == off  # a resumed opt-out stays one
    forced = resolve_run("standard", "tiny", 42, ["compile=true"])
    assert compiles(forced.train, cpu) and compiles(forced.train, cuda)
