"""What each spawned rank runs: DTensor masks compared with the same call on the full tensors.

Every case builds the same full tensors on every rank (fixed seeds), distributes them, calls
fprune on the DTensors and on the full tensors (one process, the plain path), and compares the
gathered masks. A case returns ``None`` when it passes, or a description of what differs.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import fprune

BUDGET = 8 << 20


def shard(tree, mesh, placements):
    """``tree`` of full tensors -> DTensors (``placements``: one tuple per leaf, or one for all)."""
    if isinstance(placements, dict):
        return {k: distribute_tensor(v, mesh, placements[k], src_data_rank=None) for k, v in tree.items()}
    return {k: distribute_tensor(v, mesh, placements, src_data_rank=None) for k, v in tree.items()}


def compare(got, want, placements, what: str):
    for name, mask in want.items():
        g = got[name]
        if not isinstance(g, DTensor):
            return f"{what}: {name} is a {type(g).__name__}, expected a DTensor"
        expected = placements[name] if isinstance(placements, dict) else placements
        if tuple(g.placements) != tuple(expected):
            return f"{what}: {name} placements {g.placements}, expected {expected}"
        # This rank's part of the single-process mask (no collective: each rank checks its own).
        local = g.to_local()
        ref = distribute_tensor(mask, g.device_mesh, g.placements, src_data_rank=None).to_local()
        if local.dtype != torch.bool or not torch.equal(local, ref):
            return f"{what}: {name} differs in {int((local != ref).sum())} entries"
    if fprune.distributed.last_communication().bytes > BUDGET:
        return f"{what}: {fprune.distributed.last_communication().bytes} bytes handed to collectives"
    return None


def full_params(kind: str, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shapes = {"a": (7, 5), "b": (4, 6), "c": (9,), "d": (3, 5), "e": (2, 3, 4)}
    out = {}
    for name, shape in shapes.items():
        if kind == "ties":
            out[name] = torch.randint(-2, 3, shape, generator=g).to(dtype)
        elif kind == "special":
            t = torch.randn(shape, generator=g).to(dtype)
            t.view(-1)[::4] = float("nan")
            t.view(-1)[1::5] = float("inf")
            t.view(-1)[2::7] = -0.0
            out[name] = t
        else:
            out[name] = torch.randn(shape, generator=g).to(dtype)
    return out


def one_d_placements(world):
    # Shard(0) (uneven: 7 and 3 rows on 2 and 4 ranks, an empty shard on 4), Shard(1)
    # (interleaved positions), Replicate, a Shard(2) of a 3-d leaf.
    return {"a": (Shard(0),), "b": (Shard(1),), "c": (Replicate(),), "d": (Shard(0),), "e": (Shard(2),)}


def prior_for(params, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.rand(v.shape, generator=g) > 0.3 for k, v in params.items()}


def run_cases(rank, world, two_d: bool = False, amounts=(0.3, 0.5, 0.9, 11, 0, 1.0)):
    torch.manual_seed(0)
    results = {}
    meshes = {"1d": (init_device_mesh("cpu", (world,)), one_d_placements(world))}
    if two_d:
        mesh2 = init_device_mesh("cpu", (2, world // 2))
        meshes["2d"] = (
            mesh2,
            {
                "a": (Shard(0), Shard(1)),
                "b": (Replicate(), Shard(0)),
                "c": (Replicate(), Replicate()),
                "d": (Shard(1), Replicate()),
                "e": (Shard(1), Shard(2)),
            },
        )
    weights_only = lambda name, p: p.dim() > 1
    for mesh_name, (mesh, placements) in meshes.items():
        for kind in ("randn", "ties", "special"):
            full = full_params(kind)
            sharded = shard(full, mesh, placements)
            prior = prior_for(full)
            sharded_prior = shard(prior, mesh, placements)
            scores = full_params("ties", seed=5)
            sharded_scores = shard(scores, mesh, placements)
            for amount in amounts:
                calls = {
                    "global": lambda p, *, amount=amount, **kw: fprune.global_unstructured(p, amount, **kw),
                    "l1": lambda p, *, amount=amount, **kw: fprune.l1_unstructured(
                        p, 2 if amount == 11 else amount, **kw
                    ),
                    "global-signed": lambda p, *, amount=amount, **kw: fprune.global_unstructured(
                        p, amount, signed=True, **kw
                    ),
                    "l1-signed": lambda p, *, amount=amount, **kw: fprune.l1_unstructured(
                        p, 2 if amount == 11 else amount, signed=True, **kw
                    ),
                }
                for method, call in calls.items():
                    tag = f"{mesh_name}/{kind}/{method}/{amount}"
                    results[tag] = compare(call(sharded), call(full), placements, tag)
                    results[tag + "/prior"] = compare(
                        call(sharded, masks=sharded_prior),
                        call(full, masks=prior),
                        placements,
                        tag + "/prior",
                    )
                    results[tag + "/scores"] = compare(
                        call(sharded, importance_scores=sharded_scores),
                        call(full, importance_scores=scores),
                        placements,
                        tag + "/scores",
                    )
                    results[tag + "/where"] = compare(
                        call(sharded, where=weights_only),
                        call(full, where=weights_only),
                        placements,
                        tag + "/where",
                    )
            if kind == "randn":
                for normalize in ("l1", "l2"):
                    for signed in (False, True):
                        tag = f"{mesh_name}/{kind}/global/normalize={normalize}/signed={signed}"
                        kw = dict(normalize=normalize, signed=signed)
                        results[tag] = compare(
                            fprune.global_unstructured(sharded, 0.6, masks=sharded_prior, **kw),
                            fprune.global_unstructured(full, 0.6, masks=prior, **kw),
                            placements,
                            tag,
                        )
        full64 = full_params("ties", dtype=torch.float64)
        tag = f"{mesh_name}/float64/global"
        results[tag] = compare(
            fprune.global_unstructured(shard(full64, mesh, placements), 0.45),
            fprune.global_unstructured(full64, 0.45),
            placements,
            tag,
        )
    return results


def many_leaves(rank, world):
    """Per-leaf selection over 300 sharded leaves: the histogram budget holds. Leaves of 128
    entries (radix select, ties across Shard(1)'s interleaved positions), of 15 (their keys are
    exchanged) and replicated ones (no communication), with and without prior masks."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(3)
    placements = [(Shard(1),), (Shard(0),), (Replicate(),)]
    full, place = {}, {}
    for i in range(300):
        shape = (16, 8) if i % 5 else (3, 5)
        full[f"w{i:03d}"] = torch.randint(0, 50, shape, generator=g).float()
        place[f"w{i:03d}"] = placements[i % 3]
    sharded = shard(full, mesh, place)
    prior = prior_for(full)
    sharded_prior = shard(prior, mesh, place)
    out = {}
    for method, fn in (
        ("l1", fprune.l1_unstructured),
        ("global", fprune.global_unstructured),
        ("random", lambda p, a, **kw: fprune.random_unstructured(p, a, generator=5, **kw)),
    ):
        out[method] = compare(fn(sharded, 0.4), fn(full, 0.4), place, method)
        out[method + "/bytes"] = fprune.distributed.last_communication().bytes
        out[method + "/prior"] = compare(
            fn(sharded, 0.4, masks=sharded_prior), fn(full, 0.4, masks=prior), place, method
        )
    replicated = {k: v for k, v in sharded.items() if place[k] == (Replicate(),)}
    fprune.l1_unstructured(replicated, 0.4)
    out["replicated/bytes"] = fprune.distributed.last_communication().bytes  # the fingerprint only
    return out


def expect_error(call, kind, text):
    try:
        call()
    except kind as error:
        if text not in str(error):
            return f"{kind.__name__} without {text!r}: {error}"
        return None
    except Exception as error:
        return f"expected {kind.__name__}, got {type(error).__name__}: {error}"
    return f"expected {kind.__name__}, nothing raised"


def errors(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    full = full_params("randn")
    sharded = shard(full, mesh, (Shard(0),))
    out = {}
    mixed = dict(sharded, c=full["c"])
    out["mixed"] = expect_error(lambda: fprune.global_unstructured(mixed, 0.5), TypeError, "cannot be mixed")
    partial = dict(sharded, c=DTensor.from_local(full["c"], mesh, (Partial(),)))
    out["partial"] = expect_error(lambda: fprune.global_unstructured(partial, 0.5), ValueError, "Partial")
    other_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("other",))
    elsewhere = dict(sharded, c=distribute_tensor(full["c"], other_mesh, (Shard(0),), src_data_rank=None))
    out["mesh"] = expect_error(
        lambda: fprune.global_unstructured(elsewhere, 0.5), ValueError, "one device mesh"
    )
    wrong_prior = shard(prior_for(full), mesh, (Replicate(),))
    out["prior placements"] = expect_error(
        lambda: fprune.global_unstructured(sharded, 0.5, masks=wrong_prior),
        ValueError,
        "placements of the params",
    )
    amount = 0.5 if rank == 0 else 0.6
    out["amount differs"] = expect_error(
        lambda: fprune.global_unstructured(sharded, amount), ValueError, "different inputs"
    )
    extra = dict(sharded)
    if rank == world - 1:
        extra["z"] = distribute_tensor(torch.randn(4, 4), mesh, (Shard(0),), src_data_rank=None)
    out["extra leaf"] = expect_error(
        lambda: fprune.l1_unstructured(extra, 0.5), ValueError, "different inputs"
    )
    bad = 1.5 if rank == 1 else 0.5
    out["one rank invalid"] = expect_error(
        lambda: fprune.global_unstructured(sharded, bad),
        ValueError,
        "amount=1.5" if rank == 1 else "another rank",
    )
    # Still in step afterwards: a good call works on every rank.
    out["after errors"] = compare(
        fprune.global_unstructured(sharded, 0.5), fprune.global_unstructured(full, 0.5), (Shard(0),), "after"
    )
    return out


def suite(rank, world, two_d, amounts, extra):
    """Everything one launch checks (a launch starts processes and a process group: one per world size)."""
    out = {}
    out.update(run_cases(rank, world, two_d, amounts))
    out.update({f"errors/{k}": v for k, v in errors(rank, world).items()})
    if extra:
        out.update({f"many/{k}": v for k, v in many_leaves(rank, world).items()})
        out.update({f"pruners/{k}": v for k, v in pruner_training(rank, world).items()})
    norms = (1, 2, float("inf"), float("-inf"), 0, "fro", 3) if extra else (1, float("-inf"), "fro")
    out.update({f"ln/{k}": v for k, v in structured(rank, world, two_d, norms).items()})
    out.update(random_cases(rank, world))
    out.update({f"grouped/{k}": v for k, v in grouped(rank, world, two_d, light=world > 2).items()})
    out.update({f"scopes/{k}": v for k, v in select_scopes(rank, world, two_d).items()})
    out.update({f"toy/{k}": v for k, v in toy_methods(rank, world).items()})
    if two_d:
        out.update({f"big2d/{k}": v for k, v in big_leaves_2d(rank, world).items()})
    out.update({f"fsdp/{k}": v for k, v in fsdp_training(rank, world).items()})
    return out


def fsdp_training(rank, world, steps: int = 2):
    """A pruned fully_shard model trained with masked_call equals the same in one process."""
    import copy

    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    # A transformer layer: MultiheadAttention reads out_proj.weight outside out_proj's forward.
    block = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8),
        torch.nn.ReLU(),
        block,
        torch.nn.Linear(8, 7),
        torch.nn.Tanh(),
        torch.nn.Linear(7, 3),
    )
    ref = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    weights = lambda name, p: name.endswith("weight")
    params = dict(model.named_parameters())
    ref_params = dict(ref.named_parameters())
    masks = fprune.global_unstructured(params, 0.6, where=weights)
    ref_masks = fprune.global_unstructured(ref_params, 0.6, where=weights)
    out = {"masks": compare(masks, ref_masks, (Shard(0),), "fsdp masks")}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    exact = world == 2  # FSDP averages identical gradients: exact over 2 ranks, rounding over 4
    for step in range(steps):
        x, y = torch.randn(2, 5, 6, generator=g), torch.randn(2, 5, 3, generator=g)
        loss = torch.nn.functional.mse_loss(fprune.masked_call(model, params, masks, (x,)), y)
        ref_loss = torch.nn.functional.mse_loss(fprune.masked_call(ref, ref_params, ref_masks, (x,)), y)
        for opt_, loss_ in ((opt, loss), (ref_opt, ref_loss)):
            opt_.zero_grad()
            loss_.backward()
        grads = {k: p.grad for k, p in model.named_parameters()}
        if any(v is None for v in grads.values()):
            out[f"step{step}"] = f"missing .grad: {[k for k, v in grads.items() if v is None]}"
            break
        opt.step()
        ref_opt.step()
        if float(loss.detach()) != float(ref_loss.detach()):
            out[f"step{step}/loss"] = f"loss {float(loss)!r} != {float(ref_loss)!r}"
        for name, p in model.named_parameters():
            if not (isinstance(p, DTensor) and p.is_leaf and isinstance(p, torch.nn.Parameter)):
                out[f"step{step}/{name}/leaf"] = f"{name} is no longer a leaf DTensor Parameter"
            full = p.detach().full_tensor()
            same = (
                torch.equal(full, ref_params[name])
                if exact
                else torch.allclose(full, ref_params[name], atol=1e-6)
            )
            if not same:
                out[f"step{step}/{name}"] = (
                    f"weights differ by {float((full - ref_params[name]).abs().max())}"
                )
            if name in masks:
                pruned_grad = grads[name].full_tensor()[~masks[name].full_tensor()]
                if pruned_grad.count_nonzero():
                    out[f"step{step}/{name}/grad"] = "nonzero gradient at a pruned entry"
        detached = {k: p.detach() for k, p in params.items()}
        effective = fprune.apply_masks(detached, masks)
        for name, m in masks.items():
            if effective[name].full_tensor()[~m.full_tensor()].count_nonzero():
                out[f"step{step}/{name}/zero"] = "a pruned entry is not zero"
    out["other tensors"] = expect_error(
        lambda: fprune.masked_call(model, detached, masks, (x,)), ValueError, "model's own parameters"
    )
    return out


def structured(rank, world, two_d: bool = False, norms=(1, 2, float("inf"), float("-inf"), 0, "fro", 3)):
    """ln_structured on DTensors: channels along dim 0 and 1, every norm, prior masks, ties."""
    results = {}
    meshes = {"1d": (init_device_mesh("cpu", (world,)), one_d_placements(world))}
    if two_d:
        meshes["2d"] = (
            init_device_mesh("cpu", (2, world // 2)),
            {
                "a": (Shard(0), Shard(1)),
                "b": (Replicate(), Shard(0)),
                "d": (Shard(1), Replicate()),
                "e": (Shard(1), Shard(2)),
            },
        )
    for mesh_name, (mesh, placements) in meshes.items():
        for kind in ("randn", "ties"):
            full = {k: v for k, v in full_params(kind).items() if v.dim() > 1}
            place = {k: placements[k] for k in full}
            sharded = shard(full, mesh, place)
            prior = prior_for(full)
            sharded_prior = shard(prior, mesh, place)
            for n in norms:
                for dim in (0, 1, -1):
                    for amount in (0.5, 1):
                        tag = f"{mesh_name}/{kind}/ln/n={n}/dim={dim}/{amount}"
                        call = lambda p, *, amount=amount, dim=dim, n=n, **kw: fprune.ln_structured(
                            p, amount, n, dim, **kw
                        )
                        results[tag] = compare(call(sharded), call(full), place, tag)
                        results[tag + "/prior"] = compare(
                            call(sharded, masks=sharded_prior), call(full, masks=prior), place, tag + "/prior"
                        )
    return results


def random_cases(rank, world, two_d: bool = False):
    """random_unstructured on DTensors: integer seeds, a torch.Generator and the global one."""
    results = {}
    mesh = init_device_mesh("cpu", (world,))
    placements = one_d_placements(world)
    full = full_params("randn")
    sharded = shard(full, mesh, placements)
    prior = prior_for(full)
    sharded_prior = shard(prior, mesh, placements)
    for amount in (0.3, 0.7, 2):
        for kind in ("seed", "tensor seed", "generator", "global"):
            for use_prior in (False, True):
                tag = f"random/{kind}/{amount}/prior={use_prior}"

                def call(p, m, *, amount=amount, kind=kind, use_prior=use_prior):
                    if kind == "seed":
                        gen = 1234
                    elif kind == "tensor seed":
                        gen = torch.tensor(99)
                    elif kind == "generator":
                        gen = torch.Generator().manual_seed(7)
                    else:
                        torch.manual_seed(11)
                        gen = None
                    return fprune.random_unstructured(
                        p, amount, generator=gen, masks=m if use_prior else None
                    )

                results[tag] = compare(call(sharded, sharded_prior), call(full, prior), placements, tag)
    torch.manual_seed(rank)  # the global generators now differ across ranks
    results["random/out of sync"] = expect_error(
        lambda: fprune.random_unstructured(sharded, 0.5), ValueError, "different inputs"
    )
    return results


def grouped_params(kind: str, seed: int = 0):
    """Sizes multiple of 4 along every dim (N:M along any dim), uneven over 2 and 4 ranks."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"a": (12, 8), "b": (8, 12), "c": (16,), "d": (4, 20), "e": (4, 12, 8)}
    if kind == "ties":
        return {k: torch.randint(-2, 3, s, generator=g).float() for k, s in shapes.items()}
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def grouped_placements(mesh_name):
    if mesh_name == "2d":
        return {
            "a": (Shard(0), Shard(1)),
            "b": (Replicate(), Shard(0)),
            "c": (Replicate(), Replicate()),
            "d": (Shard(1), Replicate()),
            "e": (Shard(1), Shard(2)),
        }
    # Shard(1) splits N:M groups along dim -1 on 4 ranks (2 columns each) and rows along dim 0;
    # Shard(0) of d's 4 rows over 4 ranks; 20 columns split at 10 (2 ranks) or 5, 10, 15.
    return {"a": (Shard(1),), "b": (Shard(0),), "c": (Replicate(),), "d": (Shard(1),), "e": (Shard(2),)}


def outcome(call):
    """The masks, or the error's type and message (both sides must agree on errors too)."""
    try:
        return call()
    except (ValueError, TypeError, IndexError) as error:
        return f"{type(error).__name__}: {error}"


def compare_or_errors(call_sharded, call_full, placements, tag):
    got, want = outcome(call_sharded), outcome(call_full)
    if isinstance(got, str) or isinstance(want, str):
        return None if got == want else f"{tag}: sharded {str(got)[:200]} vs one process {str(want)[:200]}"
    return compare(got, want, placements, tag)


def grouped(rank, world, two_d: bool = False, light: bool = False):
    """n_m, rowwise_unstructured and random_structured on DTensors against one process
    (``light``: fewer cases, for 4 ranks on few cores)."""
    results = {}
    names = ["1d"] + (["2d"] if two_d else [])
    kinds = ("ties",) if light else ("randn", "ties")
    pairs = ((2, 4), (1, 4)) if light else ((2, 4), (1, 4), (3, 4), (0, 2), (4, 4))
    amounts = (0.5, 2) if light else (0.3, 0.5, 0, 1.0, 2)
    for mesh_name in names:
        mesh = init_device_mesh("cpu", (world,) if mesh_name == "1d" else (2, world // 2))
        placements = grouped_placements(mesh_name)
        for kind in kinds:
            full = grouped_params(kind)
            sharded = shard(full, mesh, placements)
            prior = prior_for(full)
            sharded_prior = shard(prior, mesh, placements)
            scores = grouped_params("ties", seed=5)
            sharded_scores = shard(scores, mesh, placements)
            variants = {
                "": ({}, {}),
                "/prior": ({"masks": sharded_prior}, {"masks": prior}),
                "/scores": ({"importance_scores": sharded_scores}, {"importance_scores": scores}),
                "/signed": ({"signed": True}, {"signed": True}),
            }
            for dim in (-1, 0, 1):
                where = None if dim != 1 else (lambda name, p: p.dim() > 1)
                for n, m in pairs:
                    for suffix, (kw_s, kw_f) in variants.items():
                        tag = f"{mesh_name}/{kind}/n_m/{n}:{m}/dim={dim}{suffix}"
                        results[tag] = compare_or_errors(
                            lambda *, dim=dim, kw_s=kw_s, m=m, n=n, sharded=sharded, where=where: fprune.n_m(
                                sharded, n, m, dim=dim, where=where, **kw_s
                            ),
                            lambda *, dim=dim, full=full, kw_f=kw_f, m=m, n=n, where=where: fprune.n_m(
                                full, n, m, dim=dim, where=where, **kw_f
                            ),
                            placements,
                            tag,
                        )
                for amount in amounts:
                    for suffix, (kw_s, kw_f) in variants.items():
                        tag = f"{mesh_name}/{kind}/rowwise/{amount}/dim={dim}{suffix}"
                        results[tag] = compare_or_errors(
                            lambda *, amount=amount, dim=dim, kw_s=kw_s, sharded=sharded, where=where: (
                                fprune.rowwise_unstructured(sharded, amount, dim=dim, where=where, **kw_s)
                            ),
                            lambda *, amount=amount, dim=dim, full=full, kw_f=kw_f, where=where: (
                                fprune.rowwise_unstructured(full, amount, dim=dim, where=where, **kw_f)
                            ),
                            placements,
                            tag,
                        )
            weights = lambda name, p: p.dim() > 1
            for dim in (0, 1):
                for amount in (0.5,) if light else (0.5, 1):
                    for gen_kind in ("seed", "global") if light else ("seed", "generator", "global"):
                        for use_prior in (False, True):
                            tag = (
                                f"{mesh_name}/{kind}/random_structured/{dim}/{amount}/{gen_kind}"
                                f"/prior={use_prior}"
                            )

                            def call(
                                p,
                                mk,
                                *,
                                amount=amount,
                                dim=dim,
                                gen_kind=gen_kind,
                                use_prior=use_prior,
                                weights=weights,
                            ):
                                if gen_kind == "seed":
                                    gen = 77
                                elif gen_kind == "generator":
                                    gen = torch.Generator().manual_seed(3)
                                else:
                                    torch.manual_seed(5)
                                    gen = None
                                return fprune.random_structured(
                                    p,
                                    amount,
                                    dim,
                                    generator=gen,
                                    masks=mk if use_prior else None,
                                    where=weights,
                                )

                            results[tag] = compare_or_errors(
                                lambda *, sharded=sharded, sharded_prior=sharded_prior: call(
                                    sharded, sharded_prior
                                ),
                                lambda *, full=full, prior=prior: call(full, prior),
                                placements,
                                tag,
                            )
    return results


def pruner_training(rank, world, steps: int = 3):
    """The pruners on a fully_shard model: training steps with the pruner's update give the
    single-process loss, weights and masks, and pruned weights stay zero."""
    import copy
    import functools

    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    schedule = functools.partial(fprune.schedules.polynomial, final=0.8, end=steps)

    def grow_by_both(leaf):  # a grow criterion written for one process: sharded as it is
        return leaf.grad.abs() + 0.1 * leaf.param.abs()

    pruners = {
        "gradual/global": fprune.gradual_magnitude(schedule, every=1),
        "gradual/layerwise": fprune.gradual_magnitude(schedule, every=1, scope=fprune.select.EACH),
        "set": fprune.sparse_evolutionary(0.7, drop_fraction=0.5, every=1, end=10, seed=3),
        "rigl": fprune.rigl(0.7, distribution="uniform", drop_fraction=0.5, every=1, end=10, seed=4),
        "custom": fprune.dynamic_sparse(0.6, grow=grow_by_both, drop_fraction=0.4, every=1, end=10, seed=5),
        "movement": fprune.movement(schedule, every=1),
    }
    out = {}
    for name, pruner in pruners.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 10),
            torch.nn.ReLU(),
            torch.nn.Linear(10, 7),
            torch.nn.Tanh(),
            torch.nn.Linear(7, 3),
        )
        ref = copy.deepcopy(model)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        params, ref_params = dict(model.named_parameters()), dict(ref.named_parameters())
        state, ref_state = pruner.init(params), pruner.init(ref_params)
        masks, ref_masks = state.masks, ref_state.masks
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        dense = name in ("rigl", "custom", "movement")  # RigL grows by the dense gradient
        for step in range(steps):
            tag = f"{name}/step{step}"
            x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
            losses = []
            for m, p, mk, o in ((model, params, masks, opt), (ref, ref_params, ref_masks, ref_opt)):
                loss = torch.nn.functional.mse_loss(
                    fprune.masked_call(m, p, mk, (x,), straight_through=dense), y
                )
                o.zero_grad()
                loss.backward()
                o.step()
                losses.append(float(loss.detach()))
            if losses[0] != losses[1]:
                out[tag + "/loss"] = f"loss {losses[0]!r} != {losses[1]!r}"
            grads = {k: p.grad for k, p in params.items()} if dense else None
            ref_grads = {k: p.grad for k, p in ref_params.items()} if dense else None
            masks, state = pruner.update(params, state, grads=grads)
            ref_masks, ref_state = pruner.update(ref_params, ref_state, grads=ref_grads)
            with torch.no_grad():  # regrown weights start at zero, pruned ones are zero
                for k in params:
                    if "regrown" in state._fields:  # the dynamic sparse pruners' own field
                        params[k].masked_fill_(state.regrown[k], 0)
                        ref_params[k].masked_fill_(ref_state.regrown[k], 0)
                    params[k].mul_(masks[k])
                    ref_params[k].mul_(ref_masks[k])
            for k in params:
                if not isinstance(masks[k], DTensor):
                    out[tag + f"/{k}/kind"] = f"mask {k} is a {type(masks[k]).__name__}"
                    continue
                full_mask, full_w = masks[k].full_tensor(), params[k].detach().full_tensor()
                if not torch.equal(full_mask, ref_masks[k]):
                    out[tag + f"/{k}/mask"] = (
                        f"masks differ in {int((full_mask != ref_masks[k]).sum())} entries"
                    )
                if not torch.equal(full_w, ref_params[k].detach()):
                    out[tag + f"/{k}/weights"] = (
                        f"weights differ by {float((full_w - ref_params[k]).abs().max())}"
                    )
                if full_w[~full_mask].count_nonzero():
                    out[tag + f"/{k}/zero"] = "a pruned weight is not zero"
                if "regrown" in state._fields and not torch.equal(
                    state.regrown[k].full_tensor(), ref_state.regrown[k]
                ):
                    out[tag + f"/{k}/regrown"] = "regrown entries differ"
        out[name] = None
    return out


def big_leaves_2d(rank, world):
    """Per-leaf radix selects (leaves above the key-exchange size) on a 2-D mesh, replicas
    counted once, and split rows, against one process."""
    mesh = init_device_mesh("cpu", (2, world // 2))
    g = torch.Generator().manual_seed(9)
    placements = {
        "a": (Shard(0), Shard(1)),
        "b": (Replicate(), Shard(1)),
        "c": (Shard(1), Replicate()),
        "d": (Replicate(), Replicate()),
    }
    full = {k: torch.randint(-3, 4, (12, 10), generator=g).float() for k in placements}
    sharded = shard(full, mesh, placements)
    prior = prior_for(full)
    sharded_prior = shard(prior, mesh, placements)
    out = {}
    calls = {
        "l1": lambda p, **kw: fprune.l1_unstructured(p, 0.45, **kw),
        "random": lambda p, **kw: fprune.random_unstructured(p, 0.45, generator=3, **kw),
        "rowwise0": lambda p, **kw: fprune.rowwise_unstructured(p, 0.45, dim=0, **kw),
        "rowwise1": lambda p, **kw: fprune.rowwise_unstructured(p, 0.45, dim=1, **kw),
    }
    for name, call in calls.items():
        out[name] = compare(call(sharded), call(full), placements, name)
        out[name + "/prior"] = compare(
            call(sharded, masks=sharded_prior), call(full, masks=prior), placements, name
        )
    return out


# ----------------------------------------------------------------------------- fprune.select


def select_scopes(rank, world, two_d: bool = False):
    """fprune.select.select on DTensors with every scope (and count rules, where=, prior masks,
    both ranks) equals the same call on the full tensors in one process."""
    from fprune.select import EACH, NM, Channels, Global, Rows

    results = {}
    names = ["1d"] + (["2d"] if two_d else [])
    weights = lambda name, p: p.dim() > 1
    target = lambda remaining, size: max(round(0.6 * size) - (size - remaining), 0)
    scopes = {
        "each": (EACH, 0.4, None),
        "each/count": (EACH, 3, None),
        "each/rule": (EACH, target, None),
        "global": (Global(), 0.45, None),
        "global/l1": (Global(normalize="l1"), 0.45, None),
        "global/min_keep": (Global(min_keep=5), 0.8, None),
        "global/min_keep-fraction": (Global(min_keep=0.25), 0.6, None),
        "global/min_keep-too-many": (Global(min_keep=0.25), 0.9, None),  # raises alike
        "global/rule": (Global(), target, None),
        "channels0": (Channels(0), 0.5, weights),
        "channels1/l1": (Channels(1, reduce=1), 0.5, weights),
        "channels-1/inf": (Channels(-1, reduce=float("inf")), 1, weights),
        "rows0": (Rows(0), 0.5, weights),
        "rows1": (Rows(1), 0.4, weights),
        "nm-1": (NM(2, 4), None, None),
        "nm0": (NM(1, 4, dim=0), None, weights),
    }
    for mesh_name in names:
        mesh = init_device_mesh("cpu", (world,) if mesh_name == "1d" else (2, world // 2))
        placements = grouped_placements(mesh_name)
        for kind in ("randn", "ties"):
            full = grouped_params(kind)
            sharded = shard(full, mesh, placements)
            prior = prior_for(full)
            sharded_prior = shard(prior, mesh, placements)
            for name, (scope, amount, where) in scopes.items():
                for rank_ in ("value", "magnitude"):
                    for use_prior in (False, True):
                        tag = f"{mesh_name}/{kind}/{name}/{rank_}/prior={use_prior}"
                        kw = dict(scope=scope, rank=rank_, where=where)
                        results[tag] = compare_or_errors(
                            functools.partial(
                                fprune.select.select,
                                sharded,
                                amount,
                                masks=sharded_prior if use_prior else None,
                                **kw,
                            ),
                            functools.partial(
                                fprune.select.select, full, amount, masks=prior if use_prior else None, **kw
                            ),
                            placements,
                            tag,
                        )
        # One score per channel, given (plain tensors made alike on every rank), with params=.
        full = {k: v for k, v in grouped_params("randn").items() if v.dim() > 1}
        place = {k: placements[k] for k in full}
        sharded = shard(full, mesh, place)
        per_channel = {k: torch.arange(v.shape[0], 0, -1).float() for k, v in full.items()}
        tag = f"{mesh_name}/channels/given"
        results[tag] = compare(
            fprune.select.select(per_channel, 0.5, scope=Channels(0, reduce=None), params=sharded),
            fprune.select.select(per_channel, 0.5, scope=Channels(0, reduce=None), params=full),
            place,
            tag,
        )
    return results


def toy_methods(rank, world):
    """New methods written for one process are sharded as they are: a saliency over select
    (|p * g|, global), a method over gather_inputs/select_inputs with its own score function,
    and channels ranked by a callable reduce (whole channels: Shard along the channel dim)."""
    from fprune.select import EACH, Channels, Global, gather_inputs, select_inputs

    def taylor(params, grads, amount):  # a saliency method in one line, over fprune.select
        return fprune.select.select(
            {k: (p * grads[k]).abs() for k, p in params.items()}, amount, scope=Global()
        )

    def cubed(params, amount, *, masks=None):  # a method over the semi-public pair
        inputs = gather_inputs(params, amount, None, masks, None)
        return select_inputs(inputs, lambda i: inputs.params.leaves[i] ** 3, amount, EACH)

    def peak_channels(params, amount):  # channels by their largest |entry|, a callable reduce
        return fprune.select.select(
            params, amount, scope=Channels(0, reduce=lambda s, dims: s.abs().amax(dims))
        )

    mesh = init_device_mesh("cpu", (world,))
    placements = one_d_placements(world)
    out = {}
    for kind in ("randn", "ties"):
        full = full_params(kind)
        grads = full_params("randn", seed=8)
        sharded, sharded_grads = shard(full, mesh, placements), shard(grads, mesh, placements)
        prior = prior_for(full)
        out[f"{kind}/taylor"] = compare(
            taylor(sharded, sharded_grads, 0.4), taylor(full, grads, 0.4), placements, "taylor"
        )
        out[f"{kind}/cubed"] = compare(
            cubed(sharded, 0.5, masks=shard(prior, mesh, placements)),
            cubed(full, 0.5, masks=prior),
            placements,
            "cubed",
        )
        whole = {"a": full["a"], "d": full["d"]}  # Shard(0): whole channels along dim 0 on each rank
        place = {"a": (Shard(0),), "d": (Shard(0),)}
        out[f"{kind}/peak"] = compare(
            peak_channels(shard(whole, mesh, place), 0.5), peak_channels(whole, 0.5), place, "peak"
        )
    # Channels split across ranks cannot be reduced by a callable exactly: every rank says so.
    split = shard({"b": full_params("randn")["b"]}, mesh, {"b": (Shard(1),)})
    out["peak/split"] = expect_error(lambda: peak_channels(split, 0.5), NotImplementedError, "whole channels")
    # An invalid amount on one rank only (in the argument checks) reaches every rank.
    sharded = shard(full_params("randn"), mesh, placements)
    bad = 2.0 if rank == 0 else 0.5
    out["select/one rank invalid"] = expect_error(
        lambda: fprune.select.select(sharded, bad), ValueError, "amount=2.0" if rank == 0 else "another rank"
    )
    out["after errors"] = compare(
        fprune.select.select(sharded, 0.5, scope=Global()),
        fprune.select.select(full_params("randn"), 0.5, scope=Global()),
        placements,
        "after",
    )
    return out
