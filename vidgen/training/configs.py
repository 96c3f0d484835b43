"""Training configurations (plain dataclasses, importable without torch, one flag per field in
``vidgen train``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vidgen.config import cpu_has_native_bf16


@dataclass
class AutoencoderTrainConfig:
    run_dir: str = "runs/autoencoder"
    """Folder for checkpoints (``latest/``) and ``log.jsonl``."""
    size: int = 64
    """Canvas side in pixels."""
    num_frames: int = 9
    """Frames per training clip (1 + 4k)."""
    batch_size: int = 12
    steps: int = 20000
    """Total optimiser steps of the run (a resumed run continues towards it)."""
    minutes: float = 0.0
    """Stop this stretch after this many minutes (0: run to ``steps``)."""
    stretch_steps: int = 0
    """Stop this stretch after this many steps (0: run to ``steps``)."""
    lr: float = 1e-3
    warmup: int = 200
    weight_decay: float = 0.0
    object_weight: float = 20.0
    """Extra loss weight on object pixels and their 1-pixel neighbourhood."""
    temporal_weight: float = 4.0
    """Weight of the frame-difference loss (keeps sub-pixel motion inside a group)."""
    kl_weight: float = 1e-6
    latent_noise: float = 0.1
    """Std (relative to the latent's std) of the perturbation decoded on half the batch."""
    ema_decay: float = 0.999
    init_from: str = ""
    """Start from a finalized autoencoder folder (e.g. to fine-tune its decoder)."""
    freeze_encoder: bool = False
    """Train the decoder only: latents (and a transformer trained on them) stay valid."""
    z_dim: int = 8
    hidden_channels: int = 96
    upsample_channels: int = 0
    """Decoder head: 0 a pixel shuffle at latent resolution; N two 2x stages with N channels
    (with ``init_from``, 0 keeps the source's head)."""
    decoder_context: int = 0
    """1: the decoder also reads the latent frame before each one (from ``init_from``, the new
    input weights start at zero, so it first decodes as before)."""
    estimates_from: str = ""
    """A pipeline folder whose transformer's rollout estimates the decoder learns to decode: for
    ``estimate_share`` of the clips, their latents are replaced by the transformer's one-step
    estimates, chunk by chunk against its earlier estimates as generation makes them (noise levels
    ``estimate_sigma_min``..``_max``; the caption a paraphrase of the clip's scene), and the clip
    stays the target. Needs ``freeze_encoder``."""
    estimate_share: float = 0.5
    still_group_share: float = 0.0
    """Share of the clips (the first of each batch) decoded from the latents of the clip with each
    4-frame group held still at its last frame, the clip itself the target: the decoder learns to
    move the object inside a group from where the latent frame before left it (with
    ``decoder_context``)."""
    estimate_sigma_min: float = 0.3
    estimate_sigma_max: float = 0.7
    seed: int = 0
    log_every: int = 50
    save_every: int = 500
    eval_clips: int = 48
    threads: int = 0
    """torch threads (0: leave torch's default)."""


@dataclass
class TransformerTrainConfig:
    run_dir: str = "runs/transformer"
    """Folder for checkpoints (``latest/``) and ``log.jsonl``."""
    autoencoder: str = "runs/autoencoder/final"
    """Folder of the trained autoencoder (config.json + weights, with latents_mean/std)."""
    size: int = 64
    chunk_frames: int = 2
    """Latent frames per chunk."""
    sink_frames: int = 2
    window_frames: int = 4
    max_gap: int = 40
    """Largest gap, in latent frames, between the sinks and the window."""
    batch_size: int = 8
    steps: int = 40000
    minutes: float = 0.0
    """Stop this stretch after this many minutes (0: run to ``steps``)."""
    stretch_steps: int = 0
    """Stop this stretch after this many steps (0: run to ``steps``)."""
    lr: float = 4e-4
    warmup: int = 500
    weight_decay: float = 0.01
    ema_decay: float = 0.9995
    sigma_shift: float = 3.0
    """Shift of the training noise levels (more time at high noise)."""
    clean_context_prob: float = 0.5
    context_sigma_max: float = 0.1
    object_weight: float = 8.0
    """Extra loss weight on the latent cells of the object and their neighbours."""
    temporal_weight: float = 0.0
    """Weight of the clean estimate's error changing from one latent frame to the next: that many
    times the mean square of ``sigma * (prediction - target)`` differenced over adjacent frames that
    are both in the loss (weighted by the larger of the two frames' object weights). An error the
    frames share costs nothing there; an object that steps back or changes shape between latent
    frames costs it twice, as the distillation's ``data_temporal_weight`` does (0: off)."""
    shape_contrast: float = 0.0
    """Extra loss weight on the latent values that tell the object's shape from another shape on
    the same trajectory (the clip is redrawn with another shape and encoded too; 0: off). Shape
    is a few values of one or two tokens; this makes those values, not the whole object, count."""
    shape_contrast_per_sample: float = 0.0
    """With ``shape_contrast``: scale each sample's ``|z - z'|`` to the batch's mean per-sample amount,
    by at most this factor up or down (0: off). A small object's shape differs from another shape in
    about 2.4 times less of ``|z - z'|`` than a large one's (measured on the training clips), so
    without it the extra weight goes mostly to large objects' shapes."""
    shape_swap: float = 0.0
    """Share of samples whose noised chunks start from the clip redrawn with another shape (the
    shape-contrast clip) while the target stays the captioned clip: on the chunks at noise levels
    from ``shape_swap_sigma`` up, the model learns to draw the shape the caption names where the
    noisy input shows another. Sampling decides the shape there, and an object started as a blob
    otherwise stays a circle (0: off)."""
    shape_swap_sigma: float = 0.5
    """The noise level from which the swaps (``shape_swap``, ``oversize_swap``) apply."""
    oversize_swap: float = 0.0
    """Share of captioned samples whose noised chunks (from ``shape_swap_sigma`` up) start from the
    clip redrawn ``oversize_scale`` times as large about the same centres, cut off at the canvas
    edge, while the target stays the captioned clip: the model learns to draw the size the caption
    allows where its noisy input shows an object far too large. Sampling otherwise commits a first
    chunk's blurred guess as a giant object across the canvas edge (0: off). These samples take
    the place of the shape swap and cost one more clip through the encoder each."""
    oversize_scale: float = 2.5
    """How many times its side the ``oversize_swap`` clip draws the object (> 1; 2.5 makes a small
    object larger than a large one)."""
    lag_swap: float = 0.0
    """Share of the captioned samples without an oversize swap whose noised chunks (from
    ``shape_swap_sigma`` up) start from the clip redrawn with the object where it was 1/2 to 1 times
    ``lag_frames`` video frames earlier, while the target stays the captioned clip: the model learns
    to carry the object on at its speed where its noisy input shows it lagging behind. A sampler's
    blurred early guess sits near the last known position, and a model that follows it slows the
    object down and leaves it stuck at walls (0: off). These samples take the place of the shape
    swap and cost one more clip through the encoder each."""
    lag_frames: int = 8
    """The largest lag of ``lag_swap``, in video frames (>= 1; 8 is half a second)."""
    turn_swap: float = 0.0
    """Share of the captioned samples that show a clip's start (no gap, no prompt change) and have
    no oversize or lag swap whose noised chunks (from ``shape_swap_sigma`` up) start from the clip
    of the same object from the same start moving in another of the eight directions, while the
    target stays the captioned clip: the model learns to set off in the caption's direction where
    its noisy input shows another. The first chunks' motion is a guess that sampling commits to,
    and the later chunks carry it on (0: off). Costs one more clip through the encoder each."""
    bounce_focus: float = 0.0
    """Share of the samples without a prompt change whose clip starts (among the starts the spec
    allows) where its object bounces off a wall in the target chunk (about a fifth of unfocused
    samples do). A generated object that misses its bounce stays pressed against the wall: of the
    shipped model's arrivals at a wall on an axis its caption moves along, 57 % leave within 24
    frames (the world's: 91 %). Where no start gives such a bounce (a slow object can't reach a
    wall by then) the start is drawn as usual (0: off)."""
    wall_hold: float = 0.0
    """Share of the samples without a prompt change (drawn before ``bounce_focus``) whose clip
    starts where its object bounces off a wall in the window, and whose object is held there 4-12
    frames before it bounces, so that the target chunk shows it leaving. The chunks that show it
    held leave the loss (context only): the model learns to leave a wall it has stopped at, the
    state its own rollouts reach when they miss a bounce and that no world clip shows (0: off)."""
    direction_contrast: float = 0.0
    """Extra loss weight, as ``shape_contrast`` gives the shape, on the latent values that tell the
    object's path from the path of the same object setting off from the same place in another of
    the eight directions, on the captioned samples that show a clip's start (no gap, no prompt
    change) with a caption that names a direction; that clip is rendered and encoded too (0: off).
    The first second's motion is a few pixels of a small object, a tiny share of the loss, and a
    first chunk that sets off the wrong way decides the video until a wall turns it."""
    false_start: float = 0.0
    """Share of the captioned samples that show a clip's start with a caption that names a direction
    (no gap, no prompt change, no other swap) whose first chunk is a false start: the object holds
    still there (a ``false_start_still`` share of them) or drifts another of the eight ways into its
    start, and from the second chunk on sets off the caption's way from where it is. A clip's first
    chunk moves the object a few pixels, and a model that reads the direction off that context learns
    to ignore the caption's; after a false start only the caption tells the later chunks which way to
    go, with the object's place known. That is the pipeline's case: its first chunk, made from text
    alone, sets off any way or not at all. A drifting first chunk leaves the loss and is seen as
    context; a still one stays in it (0: off)."""
    false_start_still: float = 0.5
    """The share of ``false_start`` samples whose first chunk holds the object still (0 to 1)."""
    direction_pairs: int = 0
    """Pairs per step, besides the batch, of clip starts that differ only in the direction: the
    same object from the same place setting off the caption's way and another of the eight ways,
    each under its own caption (the same phrasing but for the direction). Both get one input, the
    mean of the two clips noised, and ``direction_pair_weight`` times the error of the difference of
    the two clean estimates against the difference of the clips, relative to that difference's
    size, is added to the loss. Only the captions can explain the difference, so the term trains
    exactly the caption's hold on the direction, which the plain loss leaves a tiny share of its
    error: a noisy input shows the direction, and the model learns to read it there instead (0: off;
    4 keeps the compiled model's shapes when the batch is 8)."""
    direction_pair_weight: float = 1.0
    """The weight of the ``direction_pairs`` term (its value starts near 1 for a model that does not
    read the direction from the caption)."""
    direction_pair_sigma_min: float = 0.0
    """The pairs' noise levels, drawn per chunk as the plain loss draws them, are mapped onto
    [this, 1]: the levels where the sampler commits to the direction while its input shows little
    of it (0: the plain loss's levels)."""
    self_context: float = 0.0
    """Share of the captioned samples without a prompt change whose context chunks are the model's
    own estimates instead of the clip's: chunk by chunk, each noised from the clip to a level drawn
    from ``self_context_sigma_min``..``_max`` and estimated in one step against the estimates before it (at
    timestep 0, as the pipeline caches its finished chunks). The last chunk's target stays the
    clip's, and the loss leaves the estimated chunks out. A rollout conditions every chunk on the
    model's own imperfect chunks (a shape half-drawn, an object a little off its path), which the
    clip-only training never shows it; here it learns to draw the caption's object on its path from
    such a context (0: off). Costs one no-grad pass over the context chunks a step."""
    self_context_sigma_min: float = 0.3
    self_context_sigma_max: float = 0.8
    """The range of noise levels ``self_context`` estimates its chunks from (0 <= min <= max < 1).
    The pipeline's last sampler step estimates its chunk from sigma 0.5, a state that is itself the
    model's rather than the clip's noised, so the range reaches above it."""
    shape_weights: str = ""
    """Relative weights of the shapes a sample's (first) scene is drawn with, ``circle:square:triangle``
    (e.g. ``1:1:2`` makes half the samples triangles; empty: uniform). For a shape the model draws
    as another: more of its samples, more of the gradient. Prompt changes keep uniform draws."""
    caption_dropout: float = 0.1
    guidance_scale: float = 1.0
    """Distil classifier-free guidance into the model (1: off). A captioned sample's regression
    target becomes its flow target plus ``guidance_scale - 1`` times the difference between the
    ``guidance_teacher``'s predictions with and without the caption: in expectation the teacher's
    guided velocity, with the clips' conditional velocity in place of the teacher's, so the model
    keeps learning from the data while it learns to draw at guidance 1 what guidance
    ``guidance_scale`` draws (one model pass a sampler step instead of two)."""
    guidance_region: Literal["all", "object"] = "all"
    """Where the guidance term is added: ``all`` latent cells, or only the cells of the ``object``
    and their neighbours (where its shape is decided). Guidance everywhere pushes the backgrounds'
    colour off the named one, as classifier-free guidance at sampling time does."""
    guidance_teacher: str = ""
    """The frozen model whose guidance is distilled: a pipeline or transformer folder, or a training
    run (its EMA). Needed when ``guidance_scale`` is not 1. Keep it the same across a run's stretches:
    a model that has learned the guidance would, as a teacher, add it again."""
    overfit_clips: int = 0
    """A diagnostic: draw every sample from this many fixed samples (0: a fresh one every time).
    With the transition, late, gap and dropout probabilities at 0, a sound loop memorises them
    (`benchmarks/default_model/diagnose.py overfit` samples their prompts afterwards)."""
    transition_prob: float = 0.2
    """Samples whose last chunks follow a fresh prompt change (text = new ‖ old)."""
    late_appearance_prob: float = 0.08
    """Samples where an appearance change has not shown yet (text = new ‖ new)."""
    gap_change_prob: float = 0.12
    """Samples whose prompt changed in the gap (sinks show the old prompt)."""
    text_max_length: int = 32
    spatial_pos: bool = False
    """Give the transformer a learned absolute position per token of the latent grid
    (``spatial_pos_grid``), zero at the start; a run resumed with it continues from the same
    function, Adam restarting."""
    text_modulation: bool = False
    """Give the transformer a linear map from the prompt's mean token embedding to every block's
    modulation (``ConditionedWanTransformer(text_modulation=True)``), zero at the start; a run resumed
    with it continues from the same function, Adam restarting. The cross-attention adds what it
    reads from the text to each token; the modulation scales the tokens' features by it, the way a
    word such as a direction must act on where the object goes."""
    text_modulation_lr_scale: float = 1.0
    """The text modulation's learning rate as a multiple of ``lr`` (its own optimizer group, as
    ``spatial_pos_lr_scale``'s table). Zero at the start, it grows by about one Adam step a step."""
    text_velocity: bool = False
    """Give the transformer a velocity read from the prompt (``ConditionedWanTransformer(text_velocity=
    True)``: attention pooling over the prompt's tokens) and a per-head gain, zero at the start,
    by which each self-attention head sees the tokens' positions from a frame moving at that
    velocity; a run resumed with it continues from the same function, Adam restarting. The
    velocity learns the caption's own (``text_velocity_weight``): the named direction at the named
    speed (the default speed when none is named), zero when no direction is named."""
    text_velocity_weight: float = 1.0
    """Weight of the squared error of the prompt's velocity against the caption's, in latent-grid
    cells per latent frame (a slow object moves ~0.3 of a cell); 0: learnt through the gains only."""
    text_velocity_lr_scale: float = 1.0
    """The velocity's pooling and gains' learning rate as a multiple of ``lr`` (their own group)."""
    spatial_pos_lr_scale: float = 1.0
    """The position table's learning rate as a multiple of ``lr``, with no weight decay. Zero at
    the start, it grows by about one Adam step a step, so at the main rate it stays a small share
    of the token (std 0.008 after 4,000 steps at 1.5e-4, against ~0.6 for the patch embedding).
    Not 1: the table is its own optimizer group, so a run's saved optimizer state fits only runs
    with the same choice (a compact checkpoint, without moments, fits either)."""
    compile: bool = True
    """torch.compile the training forward (one compile of a few minutes, then ~1.7x faster steps)."""
    bf16: bool = field(default_factory=lambda: cpu_has_native_bf16())
    """bfloat16 autocast for the autoencoder's encode and the transformer's matmuls. Default: on
    where the CPU computes bfloat16 in hardware (AVX-512 BF16 or AMX: 2-3x faster steps), off
    elsewhere (an AVX2 CPU emulates it: 5x slower steps, 35x slower encodes, measured)."""
    model: dict = field(
        default_factory=lambda: dict(
            patch_size=(1, 2, 2),
            num_attention_heads=3,
            attention_head_dim=64,
            in_channels=8,
            out_channels=8,
            text_dim=384,
            freq_dim=128,
            ffn_dim=576,
            num_layers=8,
            rope_max_seq_len=256,
        )
    )
    num_layers: int = 0
    """Transformer blocks (0: ``model``'s, 8). With ``grow_from``, at least the source's."""
    ffn_dim: int = 0
    """Width of each block's feed-forward (0: ``model``'s, 576). With ``grow_from``, at least the
    source's."""
    grow_from: str = ""
    """Start a new run (no ``latest/`` in ``run_dir`` yet) from a trained transformer grown to
    ``num_layers`` blocks and ``ffn_dim`` wide feed-forwards, computing exactly what it computes
    (:mod:`vidgen.training.grow`): a pipeline or transformer folder, or a training run (its EMA).
    The new run counts its own steps and learning-rate schedule from 0; a resumed run ignores it."""
    device: str = "cpu"
    """Where the transformer, the autoencoder and the text encoder run: ``cpu`` or ``cuda``
    (``cuda:1`` ...). The clips are drawn on the CPU, and every random draw of the loss comes from a
    CPU generator, so a step's noise does not depend on the device."""
    data_workers: int = 0
    """Processes that draw and render the clips, a step ahead of the training (0: in the training
    process, between steps). With workers each sample draws from its own stream (seed, step,
    index), so the data does not depend on how many workers there are, but differs from a run
    without them. For a GPU, whose steps outrun one CPU core's rendering."""
    seed: int = 0
    log_every: int = 50
    save_every: int = 1000
    threads: int = 0


DistillStage = Literal["ode", "self-forcing"]
ExitStep = Literal["per_rollout", "per_chunk", "last"]


@dataclass
class DistillTrainConfig:
    """Few-step distillation of a causal transformer (``vidgen train distill``): see
    ``vidgen.training.distill``. The same fields serve the Shapes World model on a CPU and a Wan-size
    model on a GPU (``device="cuda"``, ``dtype="bfloat16"``, ``prompts=FILE``)."""

    run_dir: str = "runs/distill"
    """Folder for checkpoints (``latest/``), ``log.jsonl`` and, at the end, ``transformer/`` (and
    ``pipeline/`` for MiniLM models)."""
    stage: DistillStage = "ode"
    """``ode``: regress the teacher's ODE trajectories (CausVid's initialisation); ``self-forcing``:
    DMD on the student's own autoregressive rollouts."""
    teacher: str = ""
    """The many-step model: a pipeline folder, or a transformer training run (``latest/``)."""
    base: str = ""
    """When the teacher is a training run: the pipeline folder giving text encoder, autoencoder and
    generation settings (empty: the embedded default model)."""
    init_from: str = ""
    """Student's starting weights: an earlier stage's run folder, a pipeline or transformer folder
    (empty: the teacher)."""
    prompts: str = ""
    """Text file of training prompts, one per line (empty: Shapes World captions)."""
    student_steps: int = 4
    """Denoising steps per chunk of the student (the pipeline's ``num_inference_steps``)."""
    sampler: Literal["euler", "x0_renoise"] = "x0_renoise"
    """The student's sampler (written into the exported pipeline's config)."""
    shift: float = 0.0
    """Schedule shift (0: the teacher's ``generation.shift``)."""
    teacher_steps: int = 32
    """Euler steps of the teacher's trajectories (a multiple of ``student_steps``)."""
    teacher_attention: Literal["causal", "full"] = "causal"
    """How the teacher (and the score models) see a video: ``causal``, a many-step causal model
    (the default model) making and judging it chunk by chunk as the cache shows it; ``full``, a
    bidirectional model such as Wan 2.1 T2V (CausVid's and Self Forcing's teacher), the whole
    video at once."""
    teacher_guidance: float = 1.0
    """Classifier-free guidance of the teacher: its trajectories and the real score (Wan: 3-5)."""
    rollout_chunks: int = 3
    """Chunks per training rollout (keep them within the teacher's sinks + window + one chunk)."""
    ode_pairs: int = 64
    """Teacher trajectories made once at the start of the ``ode`` stage and reused."""
    exit_step: ExitStep = "per_rollout"
    """The denoising step that keeps its gradient and ends a chunk: random and shared by the chunks of
    a rollout (Self Forcing's default), random per chunk, or always the last."""
    generator_every: int = 5
    """Self-forcing: a generator update every this many fake-score updates."""
    regression_weight: float = 0.0
    """Self-forcing: weight of the ODE regression on the teacher's trajectory pool (``ode_pairs``
    trajectories, made once as the ``ode`` stage makes them), added to every generator update: DMD's
    paired regression term, which holds the student's samples near the teacher's while the
    distribution matching moves them (0: none)."""
    data_weight: float = 0.0
    """Self-forcing: weight of the flow-matching loss on Shapes World clips (rendered from the start of
    a scene, captioned, encoded by the teacher's autoencoder), added to every generator update. It
    holds the student to the data, where ``regression_weight`` holds it to the teacher's samples
    (0: none; needs Shapes World captions, so no ``prompts`` file)."""
    data_object_weight: float = 0.0
    """The data term's weight on the latent cells the object covers (and their neighbours), ``1 +
    this`` against 1 elsewhere, normalised to mean 1, as ``vidgen train transformer
    --object-weight`` weights them (0: unweighted). On the default model 8 cost 11 points of shape
    in 1,500 steps (stop 33). A likely reason, not measured: the transformer's training pairs its
    object weight with the shape swap, and without it the weighted term rewards reading the shape
    from the noisy input rather than from the caption."""
    data_temporal_weight: float = 0.0
    """The data term's weight on its clean estimate's error changing from one latent frame to the
    next (``flow_matching_loss``'s ``temporal_weight``; on the object's cells with
    ``data_object_weight``): the error an object stepping back or changing shape between latent
    frames makes, which rule 8 fails (0: none)."""
    data_shape_swap: float = 0.0
    """Share of the data term's clips whose caption names a shape and whose noised chunks, from
    ``data_shape_swap_sigma`` up, start from the clip redrawn with another shape along the same
    trajectory; the target stays the captioned clip, so only the caption tells the shape there (as
    ``vidgen train transformer --shape-swap`` trains the many-step model; 0: none)."""
    data_shape_swap_sigma: float = 0.5
    """The noise level from which ``data_shape_swap`` applies."""
    correction_weight: float = 0.0
    """Self-forcing: weight of the corrected-continuation term, added to every generator update. The
    student rolls out 1 to ``correction_chunks`` chunks of a Shapes World caption as the pipeline
    does (no gradient); the rollout is decoded and measured as the evaluator measures it, and the
    next chunk's target is the world's own continuation of it (:func:`vidgen.shapes.correction.
    continuation`: the caption's object from where the rollout left it, at the caption's speed and
    heading, bounced where the rollout reached a wall). The student's flow-matching loss on that
    chunk, against the cache of its own rollout, teaches it to return to the caption from its own
    errors, where ``data_weight`` shows it only clean clips (0: none; needs Shapes World captions,
    so no ``prompts`` file). On the default model 1 cost 7.6 points of 1-s windows in 3,000 steps
    (stop 39): more turns at chunk boundaries, where the target breaks from the rollout."""
    correction_chunks: int = 8
    """The most chunks a ``correction_weight`` rollout makes before the chunk it corrects (each
    generator update draws 1 to this many, so bounces off the walls come into it)."""
    motion_weight: float = 0.0
    """Self-forcing: weight of the constant-velocity term, added to every generator update. The
    student's rollout (the one DMD judges) is decoded with its gradient, the object is located as the
    soft centroid of the pixels away from the caption's background colour, and the square of the
    centroid's second difference over ``motion_lag`` frames is penalised wherever no wall is near
    enough for a bounce (:mod:`vidgen.training.motion`): Shapes World moves at constant velocity
    there, and rule 8 fails a reversal there (0: none; needs Shapes World captions, so no
    ``prompts`` file)."""
    motion_speed_weight: float = 0.0
    """Self-forcing: weight of the speed term on the same track: the centroid's speed on each axis
    against the caption's (its direction and speed word; captions naming no direction are not
    judged), where no wall is near. It holds the motion the constant-velocity term could otherwise
    buy by slowing the object (0: none)."""
    motion_still_weight: float = 0.0
    """Self-forcing: weight of the still term on the same track: on the axis an axis-aligned caption
    leaves still, the centroid's 5-frame average displacement beyond half of rule 8's 0.002 S a frame,
    squared, in units of it (:func:`vidgen.training.motion.still_penalty`). Rule 8 fails a sideways
    wobble that crosses that threshold both ways; the speed term's target there is 0 too, but in
    units of the slow speed (5x the threshold) it barely sees one (0: none)."""
    motion_wall_weight: float = 0.0
    """Self-forcing: weight of the wall term on the same track: where the object's pixels touch a wall
    on an axis the caption moves along, its centroid must have left that wall by a quarter of the
    axis's named travel 8 frames later (:func:`vidgen.training.motion.wall_penalty`): the world's
    objects bounce, and one pressed against a wall fails rule 6 and wanders along it into rule 8.
    The other motion terms leave the walls' margins unjudged (0: none)."""
    motion_lag: int = 2
    """Frames between the positions the motion terms compare (the decoder's frames, 16 a second)."""
    frame_weight: float = 0.0
    """Self-forcing: weight of the frame term on the same decoded rollout: each frame's squared
    distance from its ideal, the caption's object (colour, shape, the named size or the area shown)
    drawn on the caption's background where the soft centroid puts it, per pixel of the object's
    area (:mod:`vidgen.training.ideal`). It pulls a blob of the wrong shape, a second object or a
    tinted background toward what the evaluator's frame rules 1-5 accept, without moving the path
    (0: none; needs Shapes World captions)."""
    frame_absent: bool = False
    """The frame term judges the frames the track finds no object in too (their ideal: the caption's
    object where the nearest frame showing one has it, the canvas centre when none does), so an
    object that fades out costs its whole area; otherwise such a frame costs nothing, nor does it in
    the motion terms."""
    decoded_prefix_chunks: int = 0
    """Self-forcing: how far into the video the decoded terms (motion, speed, still, frame) judge. Each
    generator update draws a prefix of 0 to this many chunks, which the student makes first as the
    pipeline does (every step, no gradient, into its cache); the terms then judge the next
    ``rollout_chunks`` chunks, made with the gradient at the exit steps, decoded with the latent
    frame before them as the streaming decoder reads it. DMD and the data term keep their rollout
    from the video's start. A 2-chunk rollout from the start shows the terms the first 13 frames;
    the evaluator judges 10 s and 10 minutes (0: the terms judge DMD's rollout; needs an
    autoencoder that decodes from a latent frame, as the default model's does)."""
    decoded_prefix_terms: str = ""
    """With ``decoded_prefix_chunks``: the decoded terms that judge the later chunks, a comma list of
    ``motion``, ``speed``, ``still``, ``wall`` and ``frame`` (empty: all of them); the others keep
    judging DMD's rollout from the video's start. The wall term needs objects that have reached a
    wall, which a rollout of the first second seldom shows."""
    dmd_prefix_chunks: int = 0
    """Self-forcing: how far into the video DMD and the fake score judge the student (Self-Forcing++
    judges windows of a long rollout likewise). Each step draws a prefix of 0 to this many chunks,
    which the student makes first as the pipeline does (every step, no gradient, into its cache);
    its ``rollout_chunks`` chunks follow, with the gradient at the exit steps. The score models see
    those chunks after the sinks and the window before them, clean, as the cache shows them to the
    first of them, and judge only those chunks; the decoded terms that judge DMD's rollout judge
    them too. A 2-chunk rollout from the start shows DMD the first second of a video whose later
    chunks read a full window of the student's own frames (0: from the start)."""
    dmd_sigma_min: float = 0.02
    dmd_sigma_max: float = 0.98
    """Range of the (shifted) noise levels at which the score models judge a rollout."""
    batch_size: int = 2
    steps: int = 1000
    minutes: float = 0.0
    """Stop this stretch after this many minutes (0: run to ``steps``)."""
    stretch_steps: int = 0
    """Stop this stretch after this many steps (0: run to ``steps``)."""
    lr: float = 2e-5
    """Learning rate of the student (Wan 1.3B in Self Forcing: 2e-6)."""
    fake_score_lr: float = 2e-5
    """Learning rate of the fake score (Wan 1.3B in Self Forcing: 4e-7)."""
    warmup: int = 20
    weight_decay: float = 0.0
    ema_decay: float = 0.99
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (student and fake score; needed for Wan-size
    models); the rollout must then fit in the cache's sinks + window + one chunk."""
    device: str = "cpu"
    """``cpu`` or ``cuda`` (``cuda:1`` ...)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype: ``bfloat16`` autocasts the transformers (fp32 master weights)."""
    seed: int = 0
    log_every: int = 10
    save_every: int = 100
    threads: int = 0
    """torch threads (0: leave torch's default)."""

    @property
    def decoded_weights(self) -> dict[str, float]:
        """The decoded terms by name (``decoded_prefix_terms``'s names) and their weights, on or off."""
        return {
            "motion": self.motion_weight,
            "speed": self.motion_speed_weight,
            "still": self.motion_still_weight,
            "wall": self.motion_wall_weight,
            "frame": self.frame_weight,
        }

    @property
    def decoded_on(self) -> frozenset[str]:
        """The decoded terms whose weight is above 0, by name."""
        return frozenset(name for name, weight in self.decoded_weights.items() if weight > 0)

    @property
    def later_terms(self) -> frozenset[str]:
        """The decoded terms that judge the later chunks (none without ``decoded_prefix_chunks``)."""
        if not self.decoded_prefix_chunks:
            return frozenset()
        if not self.decoded_prefix_terms:
            return self.decoded_on
        return (
            frozenset(t.strip() for t in self.decoded_prefix_terms.split(",") if t.strip()) & self.decoded_on
        )

    @property
    def decoded_terms(self) -> bool:
        """Whether a term judges the decoded rollout (motion, speed, still, wall, frame)."""
        return bool(self.decoded_on)

    def __post_init__(self) -> None:
        if self.stage not in ("ode", "self-forcing"):
            raise ValueError(f"stage={self.stage!r}: use 'ode' or 'self-forcing'")
        if self.exit_step not in ("per_rollout", "per_chunk", "last"):
            raise ValueError(f"exit_step={self.exit_step!r}: use 'per_rollout', 'per_chunk' or 'last'")
        if self.sampler not in ("euler", "x0_renoise"):
            raise ValueError(f"sampler={self.sampler!r}: use 'euler' or 'x0_renoise'")
        if self.teacher_attention not in ("causal", "full"):
            raise ValueError(f"teacher_attention={self.teacher_attention!r}: use 'causal' or 'full'")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r}: use 'float32' or 'bfloat16'")
        if self.student_steps < 1 or self.teacher_steps % self.student_steps:
            raise ValueError(
                f"teacher_steps={self.teacher_steps} must be a multiple of student_steps={self.student_steps} "
                "(the teacher's schedule then passes through the student's sigmas)"
            )
        for name in ("rollout_chunks", "generator_every", "batch_size", "ode_pairs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.regression_weight < 0:
            raise ValueError(f"regression_weight must be >= 0, got {self.regression_weight}")
        if self.data_weight < 0:
            raise ValueError(f"data_weight must be >= 0, got {self.data_weight}")
        if self.correction_weight < 0:
            raise ValueError(f"correction_weight must be >= 0, got {self.correction_weight}")
        if self.correction_chunks < 1:
            raise ValueError(f"correction_chunks must be >= 1, got {self.correction_chunks}")
        for name in (
            "motion_weight",
            "motion_speed_weight",
            "motion_still_weight",
            "motion_wall_weight",
            "frame_weight",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.decoded_prefix_chunks < 0:
            raise ValueError(f"decoded_prefix_chunks must be >= 0, got {self.decoded_prefix_chunks}")
        if self.decoded_prefix_chunks and not self.decoded_terms:
            raise ValueError(
                "decoded_prefix_chunks moves the decoded terms: set --motion-weight, "
                "--motion-speed-weight, --motion-still-weight, --motion-wall-weight or --frame-weight"
            )
        if self.decoded_prefix_terms:
            named = [t.strip() for t in self.decoded_prefix_terms.split(",") if t.strip()]
            unknown = sorted(set(named) - set(self.decoded_weights))
            if unknown:
                raise ValueError(
                    f"decoded_prefix_terms names {', '.join(unknown)}: the decoded terms are "
                    f"{', '.join(self.decoded_weights)}"
                )
            if not self.decoded_prefix_chunks:
                raise ValueError("decoded_prefix_terms needs --decoded-prefix-chunks")
            off = [t for t in named if not self.decoded_weights[t] > 0]
            if off:
                raise ValueError(f"decoded_prefix_terms names {', '.join(off)}, whose weight is 0")
        if self.dmd_prefix_chunks < 0:
            raise ValueError(f"dmd_prefix_chunks must be >= 0, got {self.dmd_prefix_chunks}")
        if self.frame_absent and not self.frame_weight > 0:
            raise ValueError("frame_absent widens the frame term: set --frame-weight")
        for name in ("decoded_prefix_chunks", "dmd_prefix_chunks"):
            if getattr(self, name) and self.gradient_checkpointing and self.rollout_chunks > 1:
                # behind a prefix the window is full: each graded chunk's write evicts frames the one
                # before it read, which the backward's recomputation reads again
                raise ValueError(f"{name} with gradient_checkpointing needs rollout_chunks=1")
        if self.motion_lag < 1:
            raise ValueError(f"motion_lag must be >= 1, got {self.motion_lag}")
        if self.data_object_weight < 0:
            raise ValueError(f"data_object_weight must be >= 0, got {self.data_object_weight}")
        if self.data_temporal_weight < 0:
            raise ValueError(f"data_temporal_weight must be >= 0, got {self.data_temporal_weight}")
        if not 0.0 <= self.data_shape_swap <= 1.0:
            raise ValueError(f"data_shape_swap must be in [0, 1], got {self.data_shape_swap}")
        if not 0.0 < self.data_shape_swap_sigma < 1.0:
            raise ValueError(f"data_shape_swap_sigma must be in (0, 1), got {self.data_shape_swap_sigma}")
        if not 0.0 < self.dmd_sigma_min < self.dmd_sigma_max < 1.0:
            raise ValueError("need 0 < dmd_sigma_min < dmd_sigma_max < 1")
