"""Few-step distillation on a tiny random teacher: the trainer's rollout is the pipeline's, the DMD
gradient vanishes exactly when the score models agree, ODE regression brings the student's few steps
to the teacher's many, runs resume exactly, and ``vidgen train distill`` writes loadable folders."""

import copy
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.tiny import FP32, save_tiny_pipeline
from vidgen.models import CausalWanTransformer
from vidgen.pipelines import LongVideoPipeline, loading
from vidgen.pipelines.pipeline import _chunk_generator
from vidgen.shapes.evaluate import evaluate_video
from vidgen.shapes.prompts import parse_prompt
from vidgen.training.configs import DistillTrainConfig
from vidgen.training.data import clips_to_tensor
from vidgen.training.distill import Distiller, load_teacher, train_distill
from vidgen.training.rollout import conditioning, dmd_loss, flow_matching_loss, sample_sigmas

SMALL = {"generation.height": 32, "generation.width": 32, "drift.anchor_stats": False, **FP32}
PROMPT = "a red circle moving left on a black background"


# the Wan 2.1 preset's chunking, schedule and single-prompt text, on tiny weights
WAN_LIKE = {
    "generation.chunk_frames": 3,
    "generation.sink_frames": 3,
    "generation.window_frames": 9,
    "generation.shift": 5.0,
    "model.text_conditioning": "single",
}


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory):
    return save_tiny_pipeline(tmp_path_factory.mktemp("teacher") / "pipe", seed=3, **SMALL)


@pytest.fixture(scope="module")
def wan_like_folder(tmp_path_factory):
    return save_tiny_pipeline(tmp_path_factory.mktemp("wan") / "pipe", seed=4, **SMALL, **WAN_LIKE)


_TEACHERS = {}


def _teacher(folder):
    """Loaded once per folder: the frozen teacher is shared, each run copies its own student."""
    if folder not in _TEACHERS:
        _TEACHERS[folder] = load_teacher(folder)
    return _TEACHERS[folder]


def _config(tmp_path, teacher_folder, **overrides):
    values = dict(
        run_dir=str(tmp_path / "run"),
        teacher=str(teacher_folder),
        batch_size=2,
        rollout_chunks=2,
        teacher_steps=8,
        ode_pairs=2,
        log_every=1,
        save_every=100,
        warmup=1,
    )
    return DistillTrainConfig(**{**values, **overrides})


@pytest.mark.parametrize(
    "geometry, sampler, context_noise",
    [("default", "x0_renoise", 0.0), ("default", "euler", 0.05), ("wan_like", "x0_renoise", 0.0)],
)
def test_rollout_is_the_pipelines_generation(request, tmp_path, geometry, sampler, context_noise):
    """Five chunks (past the sinks + window, so the ring and rolling positions are exercised),
    seeded as the pipeline seeds them: the trainer's rollout gives the pipeline's latents."""
    folder = request.getfixturevalue("teacher_folder" if geometry == "default" else "wan_like_folder")
    distiller = Distiller(_config(tmp_path, folder, sampler=sampler, rollout_chunks=5), _teacher(folder))
    distiller.pipe_config = distiller.pipe_config.replace(**{"generation.addnoise_condition": context_noise})
    distiller.rollout.config = distiller.pipe_config
    vae = loading.load_vae(folder, distiller.pipe_config)
    pipe = LongVideoPipeline(distiller.student, vae, distiller.teacher.text_encoder, distiller.pipe_config)
    seed, chunks, f = 11, 5, distiller.rollout.chunk_frames
    expected = pipe(PROMPT, num_frames=1 + 4 * (f * chunks - 1), generator=seed, output_type="latent").frames

    shape = (1, *distiller.chunk_shape)
    noises = [torch.randn(shape, generator=_chunk_generator(seed, i, 0, "cpu")) for i in range(chunks)]
    with torch.no_grad():
        cond = conditioning(distiller.student, distiller.embed([PROMPT]))
        video, _ = distiller.rollout.run(
            distiller.student,
            cond,
            noises,
            exits=[3] * chunks,
            step_generators=[_chunk_generator(seed, i, 4, "cpu") for i in range(chunks)],
            write_generators=[_chunk_generator(seed, f * i, 1, "cpu") for i in range(chunks)],
        )
    assert video.shape == expected.shape
    assert (video - expected).abs().max() < 1e-5
    # a rollout that stops a step early is another video: the comparison can fail
    with torch.no_grad():
        early, _ = distiller.rollout.run(distiller.student, cond, noises, exits=[2] * chunks)
    assert (early - expected).abs().max() > 1e-3


def test_dmd_gradient_vanishes_when_the_scores_agree(teacher_folder, tmp_path):
    distiller = Distiller(_config(tmp_path, teacher_folder, stage="self-forcing"), _teacher(teacher_folder))
    student = distiller.student
    generator = torch.Generator().manual_seed(0)
    text = distiller.embed([PROMPT, "a blue square moving up on a white background"])
    uncond = distiller.embed(["", ""])
    noises = distiller.noises(2, generator)
    sigma = sample_sigmas(2, 2, 2, distiller.config, distiller.shift, generator)
    noise = torch.randn((2, 4, 4, 8, 8), generator=generator)

    def generator_grad(fake) -> float:
        student.zero_grad(set_to_none=True)
        video, _ = distiller.rollout.run(student, conditioning(student, text), noises, [1, 3], grad=True)
        loss = dmd_loss(video, distiller.real, fake, text, uncond, sigma, noise, distiller.pattern, 1.0)
        loss.backward()
        grads = [p.grad.norm() for p in student.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm())

    assert generator_grad(copy.deepcopy(distiller.real)) < 1e-9
    off = copy.deepcopy(distiller.real)
    with torch.no_grad():
        off.proj_out.bias.add_(0.5)
    assert generator_grad(off) > 1e-3
    # direction: the fake score's velocity is 0.5 too high, so its clean estimate too low; descending
    # the loss moves every value of the rollout up, away from the fake estimate towards the real one
    video = torch.randn((2, 4, 4, 8, 8), generator=generator).requires_grad_(True)
    loss = dmd_loss(video, distiller.real, off, text, uncond, sigma, noise, distiller.pattern, 1.0)
    (grad,) = torch.autograd.grad(loss, video)
    assert (grad < 0).all()


def test_gradient_checkpointing_gives_the_same_gradients(teacher_folder, tmp_path):
    """Checkpointed chunks are recomputed after later chunks were cached: they read the cache as it
    was (four chunks fill this cache, so the last reads every slot)."""
    grads = []
    for checkpointing in (False, True):
        config = _config(
            tmp_path / str(checkpointing),
            teacher_folder,
            stage="self-forcing",
            rollout_chunks=4,
            exit_step="per_chunk",
            gradient_checkpointing=checkpointing,
        )
        distiller = Distiller(config, _teacher(teacher_folder))
        assert distiller.student.gradient_checkpointing == checkpointing
        with torch.no_grad():
            distiller.modules.fake_score.proj_out.bias.add_(0.5)
        distiller.self_forcing_step(0)["loss"].backward()
        grads.append(torch.cat([p.grad.flatten() for p in distiller.modules.parameters()]))
    assert grads[0].abs().max() > 1e-4
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    with pytest.raises(ValueError, match="rollout_chunks=5"):
        Distiller(
            _config(tmp_path, teacher_folder, rollout_chunks=5, gradient_checkpointing=True),
            _teacher(teacher_folder),
        )


def _four_step_error(student, distiller, pool, prompts) -> float:
    noises = [pool["levels"][:, 0, :, 2 * i : 2 * i + 2] for i in range(distiller.config.rollout_chunks)]
    with torch.no_grad():
        video, _ = distiller.rollout.run(student, conditioning(student, distiller.embed(prompts)), noises)
    return float((video - pool["clean"]).square().mean())


def test_ode_regression_brings_four_steps_to_the_teacher(teacher_folder, tmp_path):
    config = _config(
        tmp_path, teacher_folder, sampler="euler", steps=25, lr=2e-3, teacher_guidance=4.0, ema_decay=0.5
    )
    distiller = Distiller(config, _teacher(teacher_folder))
    pool, prompts = distiller.ode_pool()
    assert pool["levels"].shape == (2, 4, 4, 4, 8, 8) and pool["clean"].shape == (2, 4, 4, 8, 8)
    # the pool starts from pure noise and passes through the student's sigmas
    before = _four_step_error(distiller.student, distiller, pool, prompts)
    folder = train_distill(config, _teacher(teacher_folder))
    after = _four_step_error(CausalWanTransformer.from_pretrained(folder), distiller, pool, prompts)
    assert after < 0.5 * before, (before, after)


def test_regression_term_adds_the_pools_gradient_and_holds_the_student(teacher_folder, tmp_path):
    """``regression_weight``: a generator update's gradient is DMD's plus the weight times the pool
    regression's, and self forcing from a perturbed student brings its four steps back to the
    teacher's only when the term is on."""
    common = dict(stage="self-forcing", sampler="euler", teacher_steps=4, generator_every=1, exit_step="last")
    moved = CausalWanTransformer.from_pretrained(teacher_folder / "transformer")
    with torch.no_grad():
        moved.proj_out.bias.add_(0.3)
    moved.save_pretrained(tmp_path / "moved")

    def distiller_for(weight: float) -> Distiller:
        config = _config(tmp_path / f"g{weight}", teacher_folder, init_from=str(tmp_path / "moved"),
                         regression_weight=weight, **common)  # fmt: skip
        return Distiller(config, _teacher(teacher_folder))

    # (the critic's loss reads a detached rollout: only DMD and the term reach the student)
    distiller = distiller_for(0.0)
    pool, prompts = distiller.ode_pool()
    dmd = _student_grad(distiller, distiller.self_forcing_step(0, pool, prompts)["loss"])
    regressed = distiller_for(2.0)
    out = regressed.self_forcing_step(0, pool, prompts)
    both = _student_grad(regressed, out["loss"])
    alone = _student_grad(regressed, regressed.pool_regression(1_000_003, pool, prompts))
    assert float(out["regression_loss"].detach()) > 0
    assert alone.abs().max() > 1e-3  # the perturbed student is off the teacher's trajectories
    assert torch.allclose(both, dmd + 2.0 * alone, atol=1e-5)

    # training: the four-step error to the teacher's samples, before and after 12 updates
    errors = {}
    for weight in (0.0, 5.0):
        config = _config(tmp_path / f"t{weight}", teacher_folder, init_from=str(tmp_path / "moved"),
                         regression_weight=weight, steps=12, lr=2e-3, ema_decay=0.0, **common)  # fmt: skip
        folder = train_distill(config, _teacher(teacher_folder))
        errors[weight] = _four_step_error(
            CausalWanTransformer.from_pretrained(folder), distiller, pool, prompts
        )
    before = _four_step_error(moved, distiller, pool, prompts)
    assert errors[5.0] < 0.5 * before and errors[5.0] < 0.5 * errors[0.0], (before, errors)
    # without the pool the term cannot be computed; a negative weight is refused
    with pytest.raises(ValueError, match="trajectory pool"):
        regressed.self_forcing_step(0)
    with pytest.raises(ValueError, match="regression_weight"):
        _config(tmp_path, teacher_folder, regression_weight=-1.0)


def _student_grad(distiller: Distiller, loss: torch.Tensor) -> torch.Tensor:
    """The gradient ``loss`` leaves on the student's parameters, flattened."""
    distiller.student.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in distiller.student.parameters()])


def test_data_term_adds_the_clips_gradient_and_fits_them(teacher_folder, tmp_path):
    """``data_weight``: the clips are Shapes World videos from their start that their captions
    describe; a generator update's gradient is DMD's plus the weight times the flow-matching loss's
    on them; training with the term lowers that loss on clips it has not seen."""
    common = dict(stage="self-forcing", sampler="euler", generator_every=1, exit_step="last")

    def distiller_for(weight: float, **more) -> Distiller:
        config = _config(tmp_path / f"g{weight}", teacher_folder, data_weight=weight, **common, **more)
        return Distiller(config, _teacher(teacher_folder))

    data = distiller_for(2.0, batch_size=4, data_object_weight=8.0)
    clips, texts = data.data_clips(0)
    assert [len(c.frames) for c in clips] == [1 + 4 * (2 * 2 - 1)] * 4  # two chunks of two latent frames
    right = [evaluate_video(c.frames, t).frame_pass_rate for c, t in zip(clips, texts)]
    wrong = [evaluate_video(c.frames, t).frame_pass_rate for c, t in zip(clips, texts[1:] + texts[:1])]
    # at 32 px an object on the edge may be measured off; another clip's caption fails almost every frame
    assert sum(right) / 4 > 0.9 and max(wrong) < 0.2, (right, wrong)
    latents, _, weight, other_shape = data.data_batch(0)
    assert other_shape is None  # no shape swap asked for
    assert latents.shape == (4, 4, 4, *data.latent_hw)
    # the object weight: 1 + data_object_weight (8) on the object's latent cells and their
    # neighbours, which are a small share of each frame; 1 elsewhere
    assert weight.shape == (4, 4, *data.latent_hw)
    assert set(weight.unique().tolist()) == {1.0, 9.0}
    assert 0.0 < float((weight > 1).float().mean()) < 0.5
    # a weight of one value is the plain mean; the object weight changes the loss
    sigma = torch.full((4, 4), 0.6)
    noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(0))
    text = data.embed(texts)
    with torch.no_grad():
        plain = flow_matching_loss(data.student, latents, text, sigma, noise, data.pattern)
        flat = flow_matching_loss(
            data.student, latents, text, sigma, noise, data.pattern, weight=torch.full_like(weight, 3.0)
        )
        weighted = flow_matching_loss(data.student, latents, text, sigma, noise, data.pattern, weight=weight)
    assert torch.allclose(plain, flat, rtol=1e-5) and abs(float(weighted / plain) - 1) > 0.01

    plain = distiller_for(0.0)
    dmd = _student_grad(plain, plain.self_forcing_step(0)["loss"])
    held = distiller_for(2.0)
    out = held.self_forcing_step(0)
    both = _student_grad(held, out["loss"])
    alone = _student_grad(held, held.data_loss(0))
    assert alone.abs().max() > 1e-3
    assert torch.allclose(both, dmd + 2.0 * alone, atol=1e-5)

    # training: the loss on clips of steps the runs never drew, before and after 12 updates
    def unseen_loss(folder) -> float:
        data.modules.generator = CausalWanTransformer.from_pretrained(folder)
        with torch.no_grad():
            return sum(float(data.data_loss(10_000 + k)) for k in range(4)) / 4

    losses = {}
    for weight in (0.0, 5.0):
        config = _config(tmp_path / f"t{weight}", teacher_folder, data_weight=weight, steps=12, lr=2e-3,
                         ema_decay=0.0, **common)  # fmt: skip
        losses[weight] = unseen_loss(train_distill(config, _teacher(teacher_folder)))
    before = unseen_loss(teacher_folder / "transformer")
    assert losses[5.0] < 0.8 * before and losses[5.0] < 0.8 * losses[0.0], (before, losses)
    with pytest.raises(ValueError, match="--prompts"):
        prompts = tmp_path / "prompts.txt"
        prompts.write_text(PROMPT + "\n")
        distiller_for(1.0, prompts=str(prompts))
    with pytest.raises(ValueError, match="data_weight"):
        _config(tmp_path, teacher_folder, data_weight=-1.0)


class _Velocity(torch.nn.Module):
    """A stand-in transformer whose velocity is ``velocity(noisy)``: a known answer for a loss."""

    dtype = torch.float32

    def __init__(self, velocity):
        super().__init__()
        self.velocity = velocity

    def forward(self, noisy, timestep, text, attention_pattern=None, return_dict=False):
        return (self.velocity(noisy),)


def test_data_shape_swap_noises_another_shape_toward_the_captioned_clip(teacher_folder, tmp_path):
    """``data_shape_swap``: the data term's clips come with the same trajectory redrawn with another
    shape; a swapped sample's chunks from ``data_shape_swap_sigma`` up are noised from that clip,
    and the target's clean estimate ``noisy - sigma * v`` is still the captioned clip."""
    common = dict(stage="self-forcing", sampler="euler", data_weight=1.0, batch_size=4)

    def distiller_for(share: float, **more) -> Distiller:
        config = _config(tmp_path / f"s{share}", teacher_folder, data_shape_swap=share, **common, **more)
        return Distiller(config, _teacher(teacher_folder))

    swap = distiller_for(1.0)
    _, texts = swap.data_clips(0)
    latents, _, _, other_shape = swap.data_batch(0)
    plain_latents, _, _, none = distiller_for(0.0).data_batch(0)
    assert none is None and torch.equal(latents, plain_latents)  # the swap leaves the clips as drawn
    assert other_shape.shape == latents.shape
    named = [parse_prompt(t).shape is not None for t in texts]
    assert any(named)
    for k, has_shape in enumerate(named):
        # the redrawn clip differs; a caption that names no shape keeps its own clip
        differs = float((other_shape[k] - latents[k]).abs().max())
        assert (differs > 0.1) if has_shape else differs == 0.0, (k, texts[k], differs)

    # the target: an oracle that returns the velocity whose clean estimate is the captioned clip
    # fits the swapped loss exactly; one that assumes the noised clip is the captioned one does not
    sigma = torch.full((4, 4), 0.7)
    noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(1))
    s = sigma[:, None, :, None, None]

    text = swap.embed(texts)
    toward_clip = _Velocity(lambda noisy: (noisy - latents) / s)
    ordinary = _Velocity(lambda noisy: noise - latents)
    swapped = flow_matching_loss(toward_clip, latents, text, sigma, noise, None, source=other_shape)
    assert float(swapped) < 1e-10
    assert float(flow_matching_loss(ordinary, latents, text, sigma, noise, None, source=other_shape)) > 1e-3
    # with the source equal to the clip the target is the ordinary one, exactly
    same = flow_matching_loss(swap.student, latents, text, sigma, noise, swap.pattern, source=latents)
    plain = flow_matching_loss(swap.student, latents, text, sigma, noise, swap.pattern)
    assert torch.equal(same, plain)

    # the term swaps only from data_shape_swap_sigma up: above every drawn level it is the plain term
    with torch.no_grad():
        base = distiller_for(0.0).data_loss(3)
        high = distiller_for(1.0, data_shape_swap_sigma=0.999).data_loss(3)
        low = distiller_for(1.0, data_shape_swap_sigma=0.01).data_loss(3)
    assert torch.equal(base, high) and not torch.equal(base, low)
    with pytest.raises(ValueError, match="data_shape_swap"):
        _config(tmp_path, teacher_folder, data_shape_swap=1.5)


def test_data_temporal_weight_costs_the_error_that_changes_between_latent_frames(teacher_folder, tmp_path):
    """``data_temporal_weight``: the data term adds the weight times the mean square of the clean
    estimate's error differenced over latent frames: nothing for an error every frame shares, four
    times its square for one that flips sign from frame to frame."""
    latents = torch.randn(2, 4, 4, 4, 4, generator=torch.Generator().manual_seed(2))
    noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(3))
    sigma = torch.tensor([[0.3, 0.3, 0.8, 0.8], [0.6, 0.6, 0.5, 0.5]])
    s = sigma[:, None, :, None, None]
    text = torch.zeros(2, 1, 8)

    def off(error: torch.Tensor) -> _Velocity:
        """The velocity whose clean estimate is off from the clip by ``error``."""
        return _Velocity(lambda noisy: noise - latents - error / s)

    a = 0.25
    shared = off(torch.full(latents.shape, a))
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0])[None, None, :, None, None]
    flipping = off(a * sign.expand(latents.shape))
    for model in (shared, flipping):
        plain = flow_matching_loss(model, latents, text, sigma, noise, None)
        assert torch.allclose(plain, (a / s).square().expand(latents.shape).mean(), rtol=1e-5)
    assert torch.allclose(flow_matching_loss(shared, latents, text, sigma, noise, None, temporal_weight=3.0),
                          flow_matching_loss(shared, latents, text, sigma, noise, None), rtol=1e-6)  # fmt: skip
    added = flow_matching_loss(flipping, latents, text, sigma, noise, None, temporal_weight=3.0) - plain
    assert torch.allclose(added, torch.tensor(3.0 * (2 * a) ** 2), rtol=1e-5)
    # with an object weight the term is a weighted mean: a jitter of one size costs the same
    weight = torch.ones(2, 4, 4, 4)
    weight[:, 1, :2] = 9.0
    weighted = flow_matching_loss(flipping, latents, text, sigma, noise, None, weight=weight)
    with_jitter = flow_matching_loss(
        flipping, latents, text, sigma, noise, None, weight=weight, temporal_weight=3.0
    )
    assert torch.allclose(with_jitter - weighted, torch.tensor(3.0 * (2 * a) ** 2), rtol=1e-5)

    # in the data term: the same clips and noise, and the term on top
    def data_loss(temporal: float) -> torch.Tensor:
        config = _config(tmp_path / f"t{temporal}", teacher_folder, stage="self-forcing", data_weight=1.0,
                         data_temporal_weight=temporal)  # fmt: skip
        with torch.no_grad():
            return Distiller(config, _teacher(teacher_folder)).data_loss(5)

    assert float(data_loss(2.0)) > float(data_loss(0.0)) > 0
    with pytest.raises(ValueError, match="data_temporal_weight"):
        _config(tmp_path, teacher_folder, data_temporal_weight=-1.0)


@pytest.mark.parametrize("stage", ["ode", "self-forcing"])
def test_stretches_resume_exactly(teacher_folder, tmp_path, stage):
    common = dict(stage=stage, steps=5, generator_every=2, exit_step="per_chunk", save_every=100)
    train_distill(_config(tmp_path / "whole", teacher_folder, **common), _teacher(teacher_folder))
    split = _config(tmp_path / "split", teacher_folder, stretch_steps=3, **common)
    train_distill(split, _teacher(teacher_folder))
    assert json.loads((tmp_path / "split" / "run" / "latest" / "state.json").read_text())["step"] == 3
    train_distill(_config(tmp_path / "split", teacher_folder, **common), _teacher(teacher_folder))
    a = load_file(str(tmp_path / "whole" / "run" / "latest" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "run" / "latest" / "model.safetensors"))
    start = load_teacher(teacher_folder).transformer.state_dict()
    assert any(not torch.equal(a[f"generator.{k}"], v) for k, v in start.items())  # it trained
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_cli_distils_end_to_end(teacher_folder, tmp_path):
    from vidgen.cli import main

    ode, sf = tmp_path / "ode", tmp_path / "sf"
    common = ["--teacher", str(teacher_folder), "--steps", "2", "--batch-size", "1", "--rollout-chunks", "2"]
    assert main(["train", "distill", "--stage", "ode", "--run-dir", str(ode), "--teacher-steps", "8",
                 "--ode-pairs", "2", *common]) == 0  # fmt: skip
    assert main(["train", "distill", "--stage", "self-forcing", "--run-dir", str(sf), "--init-from", str(ode),
                 "--generator-every", "1", "--exit-step", "per_chunk", *common]) == 0  # fmt: skip
    student = CausalWanTransformer.from_pretrained(sf / "transformer")
    assert student.config.num_layers == 2
    pipe = LongVideoPipeline.from_pretrained(sf / "pipeline")
    assert pipe.config.generation.num_inference_steps == 4 and pipe.config.generation.sampler == "x0_renoise"
    frames = pipe(PROMPT, num_frames=5, generator=0).frames
    assert frames.shape == (5, 32, 32, 3)
    assert main(["train", "distill", "--run-dir", str(tmp_path / "x")]) == 2  # no teacher
    assert main(["train", "distill", "--run-dir", str(tmp_path / "z"), "--gradient-checkpointing", "true",
                 "--rollout-chunks", "9", *common[:2]]) == 2  # fmt: skip
    assert main(["train", "distill", "--teacher", str(teacher_folder), "--run-dir", str(tmp_path / "y"),
                 "--teacher-steps", "6"]) == 2  # fmt: skip


def test_bidirectional_teacher_makes_whole_video_trajectories(wan_like_folder, tmp_path):
    """``teacher_attention="full"`` (a Wan 2.1 T2V teacher) integrates the whole video at once: for
    one chunk that is the causal teacher's trajectory; for two, the first chunk also sees the second."""
    pools = {}
    for attention in ("causal", "full"):
        for chunks in (1, 2):
            config = _config(tmp_path / f"{attention}{chunks}", wan_like_folder, teacher_attention=attention)
            config.rollout_chunks = chunks
            distiller = Distiller(config, _teacher(wan_like_folder))
            pools[attention, chunks] = distiller.teacher_trajectories(
                [PROMPT], torch.Generator().manual_seed(0)
            )
    for key in ("levels", "clean"):
        assert (pools["full", 1][key] - pools["causal", 1][key]).abs().max() < 1e-5
        assert pools["full", 2][key].shape == pools["causal", 2][key].shape
    first = slice(0, 3)
    assert (
        pools["full", 2]["clean"][:, :, first] - pools["causal", 2]["clean"][:, :, first]
    ).abs().max() > 1e-4
    # and a self-forcing step scores the rollout with full attention
    distiller = Distiller(
        _config(tmp_path / "sf", wan_like_folder, stage="self-forcing", teacher_attention="full"),
        _teacher(wan_like_folder),
    )
    assert distiller.pattern is None
    out = distiller.self_forcing_step(0)
    assert torch.isfinite(out["generator_loss"]) and torch.isfinite(out["critic_loss"])


def test_bf16_autocast_steps(teacher_folder, tmp_path):
    """``--dtype bfloat16`` (the GPU setting) on the CPU: fp32 weights, bf16 cache and pool."""
    distiller = Distiller(
        _config(tmp_path / "sf", teacher_folder, stage="self-forcing", dtype="bfloat16"),
        _teacher(teacher_folder),
    )
    out = distiller.self_forcing_step(0)
    out["loss"].backward()
    assert torch.isfinite(out["generator_loss"]) and torch.isfinite(out["critic_loss"])
    assert distiller.student.dtype == torch.float32 and distiller.student.proj_out.weight.grad is not None
    assert distiller.rollout.cache(distiller.student, 2).k.dtype == torch.bfloat16
    distiller = Distiller(
        _config(tmp_path / "ode", teacher_folder, dtype="bfloat16"), _teacher(teacher_folder)
    )
    pool, prompts = distiller.ode_pool()
    assert pool["levels"].dtype == torch.bfloat16
    assert torch.isfinite(distiller.ode_step(0, pool, prompts)["loss"])


def test_correction_term_regresses_the_worlds_continuation_of_the_students_rollout(teacher_folder, tmp_path):
    """``correction_weight``: the student rolls out 1..``correction_chunks`` chunks of a caption; the
    target chunk is the autoencoder's code of the world's continuation of the decoded rollout; the
    loss predicted against the rollout's cache is the whole-video flow-matching loss with the
    rollout as clean context; a generator update's gradient is DMD's plus the weight times this
    term's."""
    common = dict(stage="self-forcing", sampler="euler", generator_every=1, exit_step="last")

    def distiller_for(weight: float, **more) -> Distiller:
        config = _config(
            tmp_path / f"c{weight}",
            teacher_folder,
            correction_weight=weight,
            correction_chunks=3,
            **common,
            **more,
        )
        return Distiller(config, _teacher(teacher_folder))

    held = distiller_for(2.0)
    f = held.correction_rollout.chunk_frames
    seen = set()
    for step in range(6):
        batch = held.correction_batch(step)
        k = batch["context_chunks"]
        seen.add(k)
        assert 1 <= k <= 3
        assert batch["video"].shape == (2, 4, k * f, *held.latent_hw)
        assert batch["frames"].shape == (2, 1 + 4 * (k * f - 1), 32, 32, 3)
        # groups of four frames are coded independently (AutoencoderKLLite): the target is the
        # continuation's own code
        found = [c for c in batch["continuations"] if c is not None]
        assert len(found) == int(batch["valid"].sum()) > 0
        own = [np.concatenate([c.clip.frames[:1], c.clip.frames]) for c in found]
        with torch.no_grad():
            code = held.vae.encode(clips_to_tensor(own)).latent_dist.mode().float()
        code = ((code - held.latent_mean) / held.latent_std)[:, :, 1:]
        torch.testing.assert_close(batch["target"][batch["valid"]], code, atol=1e-4, rtol=1e-4)
        # against the cache == the whole video (rollout clean, then the noised target) in one forward
        gen = torch.Generator().manual_seed(step)
        sigma = torch.rand(2, 1, generator=gen).repeat(1, f) * 0.9 + 0.05
        noise = torch.randn(batch["target"].shape, generator=gen)
        with torch.no_grad():
            cached = held.correction_prediction_loss(batch, sigma, noise)
            whole = flow_matching_loss(
                held.student,
                torch.cat([batch["video"], batch["target"]], dim=2),
                held.embed(batch["texts"]),
                torch.cat([torch.zeros(2, k * f), sigma], dim=1),
                torch.cat([torch.zeros_like(batch["video"]), noise], dim=2),
                held.pattern,
                weight=torch.cat(
                    [
                        torch.zeros(2, k * f, *held.latent_hw),
                        batch["valid"].float()[:, None, None, None].expand(2, f, *held.latent_hw),
                    ],
                    dim=1,
                ),
            )
        torch.testing.assert_close(cached, whole, atol=1e-5, rtol=1e-4)
    assert len(seen) > 1  # the context length varies

    plain = distiller_for(0.0)
    dmd = _student_grad(plain, plain.self_forcing_step(0)["loss"])
    held = distiller_for(2.0)
    both = _student_grad(held, held.self_forcing_step(0)["loss"])
    alone = _student_grad(held, held.correction_loss(0))
    assert alone.abs().max() > 1e-3
    torch.testing.assert_close(both, dmd + 2.0 * alone, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="--prompts"):
        prompts = tmp_path / "prompts.txt"
        prompts.write_text(PROMPT + "\n")
        distiller_for(1.0, prompts=str(prompts))
    for bad in (dict(correction_weight=-1.0), dict(correction_chunks=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            _config(tmp_path, teacher_folder, **bad)


def test_decoded_terms_add_their_gradient(teacher_folder, tmp_path, monkeypatch):
    """``motion_weight`` / ``motion_speed_weight`` / ``motion_still_weight`` / ``motion_wall_weight`` /
    ``frame_weight``: the
    rollout DMD judges is decoded with its gradient, tracked (:mod:`vidgen.training.motion`) and
    held to its ideal frames (:mod:`vidgen.training.ideal`); a generator update's gradient is DMD's
    plus each weight times its term's."""
    from vidgen.training import motion

    # a random tiny teacher's frames are noise whose extent spans the frame: no entry would be clear
    # of the walls; without the margin every entry is judged (the terms' own tests judge the margin)
    monkeypatch.setattr(motion, "WALL_MARGIN", -10.0)
    common = dict(stage="self-forcing", sampler="euler", generator_every=1, exit_step="last")
    weights = {"motion_loss": 2.0, "speed_loss": 3.0, "still_loss": 1.5, "wall_loss": 0.7, "frame_loss": 0.5}

    def distiller_for(*on: str, **more) -> Distiller:
        w = {name: (weights[name] if name in on else 0.0) for name in weights}
        config = _config(tmp_path / "_".join(on or ("none",)), teacher_folder, motion_weight=w["motion_loss"],
                         motion_speed_weight=w["speed_loss"], motion_still_weight=w["still_loss"],
                         motion_wall_weight=w["wall_loss"], frame_weight=w["frame_loss"], motion_lag=1,
                         **common, **more)  # fmt: skip
        return Distiller(config, _teacher(teacher_folder))

    plain = distiller_for()
    expected = _student_grad(plain, plain.self_forcing_step(0)["loss"])
    for name, weight in weights.items():
        # each term alone, on the same rollout (the step's seed fixes it)
        held = distiller_for(name)
        term = held.self_forcing_step(0)[name]
        assert float(term.detach()) > 0  # noise does not move straight nor look like a shape
        alone = _student_grad(held, term)
        assert alone.abs().max() > 0
        expected = expected + weight * alone
    full = distiller_for(*weights)
    out = full.self_forcing_step(0)
    assert set(out) >= set(weights)
    torch.testing.assert_close(_student_grad(full, out["loss"]), expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="--prompts"):
        prompts = tmp_path / "prompts.txt"
        prompts.write_text(PROMPT + "\n")
        distiller_for("frame_loss", prompts=str(prompts))
    for bad in (
        "motion_weight",
        "motion_speed_weight",
        "motion_still_weight",
        "motion_wall_weight",
        "frame_weight",
        "motion_lag",
    ):
        with pytest.raises(ValueError, match=bad):
            _config(tmp_path, teacher_folder, **{bad: -1.0 if bad != "motion_lag" else 0})


def test_decoded_prefix_terms_split_the_terms_between_the_rollouts(teacher_folder, tmp_path):
    """``decoded_prefix_terms``: the terms it names judge the later rollout, the others DMD's rollout
    from the video's start, as they do without a prefix."""
    common = dict(stage="self-forcing", sampler="euler", generator_every=1, exit_step="last")
    split = Distiller(
        _config(
            tmp_path / "split",
            teacher_folder,
            frame_weight=1.0,
            motion_still_weight=1.0,
            decoded_prefix_chunks=4,
            decoded_prefix_terms="frame",
            **common,
        ),
        _teacher(teacher_folder),
    )
    out = split.self_forcing_step(7)
    start = Distiller(
        _config(tmp_path / "start", teacher_folder, motion_still_weight=1.0, **common),
        _teacher(teacher_folder),
    )
    # the still term: on the rollout from the start, as without the prefix (PROMPT names "left": y is still)
    expected_still = start.self_forcing_step(7)["still_loss"].detach()
    assert float(expected_still) > 0
    torch.testing.assert_close(out["still_loss"].detach(), expected_still, atol=1e-6, rtol=1e-5)
    # the frame term: on the later rollout of the prefix the step draws
    config = split.config
    rng = np.random.default_rng([config.seed, 7])
    prompts = split.prompts.sample(rng, config.batch_size)
    split.exit_steps(rng)
    drawn = int(rng.integers(0, config.decoded_prefix_chunks + 1))
    last = split.student_schedule.num_steps - 1
    with torch.no_grad():
        cond = conditioning(split.student, split.embed(prompts))
        late, at, before = split.later_rollout(7, cond, [last, last], drawn)
        later = split.decoded_losses(late, prompts, at, before)
    assert set(later) == {"frame_loss", "still_loss"}
    torch.testing.assert_close(out["frame_loss"].detach(), later["frame_loss"], atol=1e-5, rtol=1e-4)
    # the later rollout's still term is another number: the comparison above could fail
    assert abs(float(later["still_loss"]) - float(expected_still)) > 1e-4 * float(expected_still)
    assert config.later_terms == {"frame"}
    both = _config(
        tmp_path / "both", teacher_folder, frame_weight=1.0, motion_still_weight=1.0, decoded_prefix_chunks=4
    )
    assert both.later_terms == {"frame", "still"}
    for bad, match in (
        (dict(decoded_prefix_terms="wall,bounce"), "names bounce"),
        (dict(decoded_prefix_terms="frame", decoded_prefix_chunks=0), "needs --decoded-prefix-chunks"),
        (dict(decoded_prefix_terms="wall"), "wall, whose weight is 0"),
    ):
        kwargs = dict(frame_weight=1.0, decoded_prefix_chunks=2) | bad
        with pytest.raises(ValueError, match=match):
            _config(tmp_path, teacher_folder, **kwargs)


def test_decoded_prefix_judges_later_chunks_of_the_students_rollout(teacher_folder, tmp_path):
    """``decoded_prefix_chunks``: the decoded terms judge the chunks after a prefix the student makes
    as the pipeline does. The later rollout's chunks are the pipeline's (every step, past the point
    where the window slides), the gradient reaches them and not the prefix, they decode exactly as
    the whole rollout decodes with a decoder that reads the latent frame before, and a generator
    update's decoded term is the one on that rollout."""
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.pipelines.vae_stream import frames_of_latents, latent_stats

    common = dict(stage="self-forcing", sampler="euler", generator_every=1, exit_step="last")
    config = _config(tmp_path / "later", teacher_folder, frame_weight=1.0, decoded_prefix_chunks=4, **common)
    distiller = Distiller(config, _teacher(teacher_folder))
    student, chunk = distiller.student, distiller.rollout.chunk_frames
    text = distiller.embed([PROMPT, "a blue square moving up on a white background"])
    last = distiller.student_schedule.num_steps - 1
    prefix = 3  # 5 chunks of 2 latent frames: past the tiny cache's sinks (2) + window (4)
    with torch.no_grad():
        whole, _ = distiller.rollout.run(
            student, conditioning(student, text), distiller.later_noises(7, prefix)
        )
    window, first, before = distiller.later_rollout(7, conditioning(student, text), [last, last], prefix)
    assert first == prefix * chunk and before is not None and not before.requires_grad
    torch.testing.assert_close(window.detach(), whole[:, :, first:], atol=1e-5, rtol=0)
    torch.testing.assert_close(before, whole[:, :, first - 1 : first], atol=1e-5, rtol=0)
    # another prefix is another rollout: the comparison can fail
    other, _, _ = distiller.later_rollout(7, conditioning(student, text), [last, last], prefix - 1)
    assert (other.detach() - window.detach()).abs().max() > 1e-3
    # the gradient is the graded chunks': the loss on the window moves the student
    assert _student_grad(distiller, window.square().mean()).abs().max() > 0

    # decoding from a later frame with the frame before: the whole rollout's frames, exactly
    torch.manual_seed(0)
    distiller.vae = AutoencoderKLLite(
        z_dim=4, hidden_channels=16, encoder_blocks=1, decoder_blocks=1, refine_channels=8, decoder_context=1
    ).eval()
    distiller.latent_mean, distiller.latent_std = latent_stats(distiller.vae)
    with torch.no_grad():
        full = distiller.decode(whole)
        part = distiller.decode(whole[:, :, first:], first, whole[:, :, first - 1 : first])
        start, end = frames_of_latents(first, whole.shape[2] - first, distiller.temporal)
        torch.testing.assert_close(part, full[:, :, start:end], atol=1e-5, rtol=0)
        # without the frame before, the context decoder draws other frames
        blind = distiller.decode(whole[:, :, first:], first, torch.zeros_like(whole[:, :, :1]))
        assert (blind - full[:, :, start:end]).abs().max() > 1e-3

    # a generator update's frame term is the one on the later rollout of the prefix it draws
    fresh = Distiller(
        _config(tmp_path / "fresh", teacher_folder, frame_weight=1.0, decoded_prefix_chunks=4, **common),
        _teacher(teacher_folder),
    )
    out = fresh.self_forcing_step(7)
    rng = np.random.default_rng([config.seed, 7])  # the step's draws: prompts, exits, then the prefix
    prompts = fresh.prompts.sample(rng, config.batch_size)
    fresh.exit_steps(rng)
    drawn = int(rng.integers(0, config.decoded_prefix_chunks + 1))
    with torch.no_grad():
        cond = conditioning(fresh.student, fresh.embed(prompts))
        late, at, before = fresh.later_rollout(7, cond, [last, last], drawn)
        again = fresh.decoded_losses(late, prompts, at, before)["frame_loss"]
        from_start = fresh.decoded_losses(fresh.later_rollout(7, cond, [last, last], 0)[0], prompts)[
            "frame_loss"
        ]
    torch.testing.assert_close(out["frame_loss"].detach(), again, atol=1e-5, rtol=1e-4)
    assert drawn > 0 and abs(float(again) - float(from_start)) > 1e-4 * float(again)
    for bad, match in (
        (dict(decoded_prefix_chunks=-1), "decoded_prefix_chunks"),
        (dict(decoded_prefix_chunks=2), "--frame-weight"),
    ):
        with pytest.raises(ValueError, match=match):
            _config(tmp_path, teacher_folder, **bad)
    with pytest.raises(ValueError, match="--frame-weight"):
        _config(tmp_path, teacher_folder, frame_absent=True)
    with pytest.raises(ValueError, match="rollout_chunks=1"):
        _config(
            tmp_path / "ckpt",
            teacher_folder,
            frame_weight=1.0,
            decoded_prefix_chunks=2,
            gradient_checkpointing=True,
            **common,
        )


def test_dmd_prefix_judges_later_chunks_after_their_context(teacher_folder, tmp_path):
    """``dmd_prefix_chunks``: a step's rollout follows a prefix the student makes as the pipeline
    does; DMD and the fake score see its chunks after the sinks and the window before them, at sigma
    0, and judge only those chunks (the losses recomputed here from the score models' velocities).
    A step that draws no prefix is the plain step."""
    from vidgen.training.rollout import velocity

    common = dict(stage="self-forcing", sampler="euler", generator_every=1, exit_step="last")
    config = _config(tmp_path / "late", teacher_folder, dmd_prefix_chunks=5, **common)

    def distiller_for(cfg) -> Distiller:
        d = Distiller(cfg, _teacher(teacher_folder))
        with torch.no_grad():  # a fake score that disagrees with the teacher: DMD is not 0
            d.modules.fake_score.proj_out.bias.add_(0.3)
        return d

    late = distiller_for(config)
    draws = {}
    for step in range(40):
        rng = np.random.default_rng([config.seed, step])
        late.prompts.sample(rng, config.batch_size)
        late.exit_steps(rng)
        draws.setdefault(int(rng.integers(0, config.dmd_prefix_chunks + 1)), step)
    step, prefix = draws[4], 4  # 8 latent frames before: past the tiny cache's sinks (2) + window (4)
    out = late.self_forcing_step(step)

    rng = np.random.default_rng([config.seed, step])
    prompts = late.prompts.sample(rng, config.batch_size)
    text = late.embed(prompts)
    uncond = late.embed([""] * config.batch_size)
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    noises = late.noises(config.batch_size, generator)
    step_generator = torch.Generator().manual_seed(config.seed * 7_919 + step)
    with torch.no_grad():
        whole, _ = late.rollout.run(
            late.student,
            conditioning(late.student, text),
            late.prefix_noises(step, prefix) + noises,
            step_generators=[step_generator] * (prefix + 2),
            write_generators=[step_generator] * (prefix + 2),
        )
    assert whole.shape[2] == 12
    # the sinks (frames 0-1), the window before frame 8 (4-7), the judged chunks (8-11)
    scored = torch.cat([whole[:, :, :2], whole[:, :, 4:]], dim=2)
    context = 6

    def flow(sigma, noise):
        s = sigma[:, None, :, None, None]
        return scored * (1 - s) + noise * s, s

    sigma = sample_sigmas(2, 2, 2, config, late.shift, generator)
    sigma = torch.cat([torch.zeros(2, context), sigma], dim=1)
    noisy, s = flow(sigma, torch.randn(scored.shape, generator=generator))
    with torch.no_grad():
        fake = noisy - s * velocity(late.modules.fake_score, noisy, sigma, text, late.pattern)
        real = noisy - s * velocity(late.real, noisy, sigma, text, late.pattern, uncond=uncond)
    judged = slice(context, None)
    normalizer = (scored - real)[:, :, judged].abs().mean(dim=(1, 2, 3, 4), keepdim=True)
    expected_dmd = 0.5 * ((fake - real)[:, :, judged] / normalizer).square().mean()
    # the tiny model reads its context weakly: context at sigma 0.1 moves the losses by 2e-5 and 7e-5
    torch.testing.assert_close(out["generator_loss"].detach(), expected_dmd, atol=1e-7, rtol=2e-6)

    sigma = sample_sigmas(2, 2, 2, config, late.shift, generator)
    sigma = torch.cat([torch.zeros(2, context), sigma], dim=1)
    noise = torch.randn(scored.shape, generator=generator)
    noisy, _ = flow(sigma, noise)
    with torch.no_grad():
        v = velocity(late.modules.fake_score, noisy, sigma, text, late.pattern)
    expected_critic = (v - (noise - scored))[:, :, judged].square().mean()
    torch.testing.assert_close(out["critic_loss"].detach(), expected_critic, atol=1e-7, rtol=2e-6)

    # the judged chunks read as a video's start (no context) are judged otherwise: the context counts
    sigma = torch.full((2, 4), 0.5)
    with torch.no_grad():
        alone = dmd_loss(whole[:, :, 8:], late.real, late.modules.fake_score, text, uncond, sigma,
                         torch.zeros(2, 4, 4, 8, 8), late.pattern, 1.0)  # fmt: skip
        read = dmd_loss(scored, late.real, late.modules.fake_score, text, uncond,
                        torch.cat([torch.zeros(2, context), sigma], dim=1), torch.zeros_like(scored),
                        late.pattern, 1.0, context_frames=context)  # fmt: skip
    assert abs(float(alone) - float(read)) > 1e-3 * float(read)
    # the gradient reaches the student through the judged chunks
    assert _student_grad(late, out["loss"]).abs().max() > 0

    # a step that draws no prefix is the plain distiller's step
    plain = distiller_for(_config(tmp_path / "plain", teacher_folder, **common))
    at_start = distiller_for(config).self_forcing_step(draws[0])
    expected = plain.self_forcing_step(draws[0])
    for name in ("generator_loss", "critic_loss"):
        torch.testing.assert_close(at_start[name].detach(), expected[name].detach(), atol=1e-6, rtol=1e-5)
    for bad, match in (
        (dict(dmd_prefix_chunks=-1), "dmd_prefix_chunks must be"),
        (dict(dmd_prefix_chunks=2, gradient_checkpointing=True), "dmd_prefix_chunks with gradient"),
    ):
        with pytest.raises(ValueError, match=match):
            _config(tmp_path, teacher_folder, **bad)
