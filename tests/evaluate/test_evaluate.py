"""`eyrie evaluate`'s pure parts and its SpecForge glue: the chain formula, intervals and verdict, the
held-out split and its leakage guard, the equal budgets, the CPU loss against SpecForge's kernel, the
errors a user meets, and the process state training leaves. The end-to-end drafter ranking (own
answers above an impostor's, the shuffled control last) is tests/evaluate/test_evaluate_drafters.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eyrie.jobs.evaluate import figures
from eyrie.jobs.evaluate.plan import (
    Heldout,
    Leakage,
    SampleFacts,
    TooFewSamples,
    check_disjoint,
    choose_heldout,
    prompt_key,
    row_id,
    steps_plan,
    training_set,
)


def _counts(n: int, acc: list[float], tokens: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = np.full((n, len(acc)), float(tokens))
    c = np.stack([rng.binomial(tokens, a, size=n) for a in acc], axis=1).astype(float)
    return c, d


# ------------------------------------------------------------------------------------------- figures


def test_accepted_length_is_the_chain_formula_and_specforges_plus_one():
    from specforge.eval.evaluator import Evaluator

    acc = [0.8, 0.6, 0.5]
    assert figures.accepted_length(acc) == pytest.approx(1 + 0.8 + 0.8 * 0.6 + 0.8 * 0.6 * 0.5)
    assert figures.accepted_length(acc) == pytest.approx(1 + Evaluator._simulated_acc_len(acc))
    assert figures.accepted_length([]) == 1.0


def test_acceptance_is_ratio_of_sums_and_its_length_agrees_with_its_positions():
    c, d = _counts(40, [0.7, 0.5, 0.4])
    a = figures.acceptance(c, d)
    for j, e in enumerate(a.by_position):
        assert e.value == pytest.approx(c[:, j].sum() / d[:, j].sum())
        assert e.low <= e.value <= e.high
    assert a.length.value == pytest.approx(figures.accepted_length([e.value for e in a.by_position]))
    assert a.length.low <= a.length.value <= a.length.high
    assert a.specforge_simulated_acc_len == pytest.approx(a.length.value - 1)
    assert a.samples == 40 and a.tokens == 40 * 50


def test_the_interval_shrinks_with_more_heldout_samples():
    widths = []
    for n in (20, 80, 320):
        a = figures.acceptance(*_counts(n, [0.7, 0.5, 0.4], seed=n))
        widths.append(a.length.high - a.length.low)
    assert widths[0] > widths[1] > widths[2]
    assert widths[0] / widths[2] == pytest.approx(4, rel=0.35)  # one over the root of the samples


def test_a_paired_difference_separates_a_real_gap_and_not_noise():
    ref = _counts(200, [0.8, 0.6, 0.5], seed=1)
    worse = _counts(200, [0.6, 0.4, 0.3], seed=2)
    same = _counts(200, [0.8, 0.6, 0.5], seed=3)
    gap = figures.length_difference(ref, worse)
    assert gap.value < 0 and figures.separates(gap)
    noise = figures.length_difference(ref, same)
    assert not figures.separates(noise)
    need = figures.samples_to_separate(noise)
    assert need is None or need >= 200
    text = figures.verdict_sentence("mine", "theirs", figures.acceptance(*ref).length,
                                    figures.acceptance(*worse).length, gap)
    assert text.startswith(f"a drafter trained on theirs accepts {abs(gap.value):.2f} [")
    assert " fewer tokens per step" in text
    lo, hi = text.split("[", 1)[1].split("]", 1)[0].split(", ")
    assert float(lo) <= abs(gap.value) <= float(hi)  # "0.4 [0.2, 0.6] fewer"
    assert "same within what 200 held-out samples can tell" in figures.verdict_sentence(
        "mine", "same", figures.acceptance(*ref).length, figures.acceptance(*same).length, noise)


def test_counts_that_cannot_be_are_refused():
    with pytest.raises(ValueError):
        figures.acceptance(np.array([[3.0]]), np.array([[2.0]]))
    with pytest.raises(ValueError):
        figures.acceptance(np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(ValueError):
        figures.length_difference(_counts(5, [0.5]), _counts(6, [0.5]))


# ---------------------------------------------------------------------------------------------- plan


def _facts(n: int, prefix: str = "s", prompt: str = "p") -> list[SampleFacts]:
    return [SampleFacts(f"{prefix}{i}", f"{prefix}{i}", f"{prompt}{i}", 10 + i % 7, 40 + i) for i in range(n)]


def test_a_larger_heldout_set_holds_the_smaller_and_the_seed_moves_it():
    s = _facts(100)
    small, big = choose_heldout(s, 10, 0, 5), choose_heldout(s, 30, 0, 5)
    assert set(small) <= set(big) and len(big) == 30
    assert choose_heldout(s, 10, 1, 5) != small


def test_too_few_samples_says_how_many_are_needed():
    with pytest.raises(TooFewSamples, match=r"20 samples .*--heldout 18 needs at least 23 .* lower --heldout to 15"):
        choose_heldout(_facts(20), 18, 0, 5)


def test_no_drafter_trains_on_a_heldout_prompt_from_any_output():
    ref = _facts(50)
    held = Heldout.of(ref[i] for i in choose_heldout(ref, 10, 0, 5))
    train, left = training_set(ref, held)
    assert left == 10 and not {ref[i].sample_id for i in train} & held.ids
    # another output: the same dataset rows (ids), an agentic turn of one, the same prompt under another id
    other = [*_facts(50, prompt="q"), SampleFacts(f"{sorted(held.ids)[0]}.t2", sorted(held.ids)[0], "z", 5),
             SampleFacts("elsewhere", "elsewhere", sorted(held.prompts)[0], 5)]
    kept, left = training_set(other, held)
    assert left == 12
    check_disjoint((other[i] for i in kept), held, "other")
    with pytest.raises(Leakage, match=r"other: 1 training samples are held-out prompts"):
        check_disjoint([other[-1]], held, "other")


def test_row_id_and_prompt_key():
    assert row_id("abc.t3") == "abc" and row_id("abc") == "abc" and row_id("a.tx") == "a.tx"
    assert prompt_key([1, 2, 3, 9], [0, 0, 0, 1]) == prompt_key([1, 2, 3, 7, 7], [0, 0, 0, 1, 1])
    assert prompt_key([1, 2, 3, 9], [0, 0, 0, 1]) != prompt_key([1, 2, 4, 9], [0, 0, 0, 1])


def test_every_drafter_gets_the_same_steps_and_loss_tokens():
    a, b = [13, 40, 7, 90, 22], [300, 5, 5]
    pa = steps_plan(a, range(5), 25, 64, seed=3, lengths=[x * 3 for x in a])
    pb = steps_plan(b, range(3), 25, 64, seed=3)
    for plan, loss in ((pa, a), (pb, b)):
        assert len(plan) == 25
        for step in plan:
            used = [t.loss_cap if t.loss_cap is not None else loss[t.index] for t in step]
            assert sum(used) == 64 and all(u > 0 for u in used)
    assert steps_plan(a, range(5), 25, 64, seed=3) == steps_plan(a, range(5), 25, 64, seed=3)


# ------------------------------------------------------------------------------ SpecForge's loss on CPU


def _kernel_forward(logits, target, mask):
    """The forward of SpecForge's Triton `log_softmax_forward_kernel`, as its source computes it: per
    row with a nonzero mask, -sum(target * (x - max - log(sum exp(x - max)))), then the mean over rows."""
    x = logits.double().reshape(-1, logits.shape[-1])
    t = target.double().reshape(-1, target.shape[-1])
    m = mask.reshape(-1).bool()
    mx = x.max(-1, keepdim=True).values
    d = torch.exp(x - mx).sum(-1, keepdim=True)
    row = -(t * (x - mx - torch.log(d))).sum(-1)
    return torch.where(m, row, 0).mean(), x, t, m, mx, d


def _kernel_backward(logits, target, mask, grad_out=1.0):
    """`log_softmax_backward_kernel`: -(target * g - softmax(x) * sum(target * g)) / (B*T), 0 where masked."""
    _, x, t, m, mx, d = _kernel_forward(logits, target, mask)
    g = grad_out / x.shape[0]
    soft = torch.exp(x - mx) / d
    grad = -(t * g - soft * (t * g).sum(-1, keepdim=True))
    return torch.where(m[:, None], grad, 0).reshape(logits.shape)


def test_the_cpu_loss_is_specforges_formula_and_the_kernels_forward_and_backward():
    from specforge.core.loss import _compute_loss

    from eyrie.jobs.evaluate.drafter import TorchLogSoftmaxLoss, specforge_backend

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 11, 97, generator=g).requires_grad_()
    target = torch.softmax(torch.randn(3, 11, 97, generator=g), -1)
    mask = (torch.rand(3, 11, 1, generator=g) > 0.3).float()
    with specforge_backend(torch.device("cpu")):
        loss = TorchLogSoftmaxLoss.apply(logits, target, mask)
        assert loss.item() == pytest.approx(_compute_loss(logits, target, mask).item(), rel=1e-6)
    loss.backward()
    assert loss.item() == pytest.approx(_kernel_forward(logits.detach(), target, mask)[0].item(), rel=1e-5)
    torch.testing.assert_close(logits.grad.double(), _kernel_backward(logits.detach(), target, mask),
                               rtol=1e-4, atol=1e-7)


def test_the_backend_swap_and_training_leave_process_state_as_found():
    import specforge.algorithms.eagle3.model as eagle3_model

    from eyrie.jobs.evaluate.drafter import specforge_backend

    kernel = eagle3_model.LogSoftmaxLoss
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"), specforge_backend(torch.device("cpu")):
        assert eagle3_model.LogSoftmaxLoss is not kernel
        raise RuntimeError("boom")
    assert eagle3_model.LogSoftmaxLoss is kernel and torch.get_num_threads() == threads


# ---------------------------------------------------------------------------------------------- errors


def test_an_output_without_hidden_states_names_the_command(tmp_path):
    from eyrie.jobs.evaluate.data import NoHiddenStates, open_corpus

    (tmp_path / "samples").mkdir()
    with pytest.raises(NoHiddenStates, match=r"no hidden states .*eyrie extract SPEC"):
        open_corpus(str(tmp_path))


def test_outputs_of_different_targets_are_refused(tmp_path):
    from eyrie.jobs.evaluate.data import Corpus, DifferentTargets, Target, check_same_target
    from eyrie.jobs.store import open_store

    store = open_store(str(tmp_path))
    a = Corpus(store, Target("/m/a", "builtin:tiny-chat", "c1", (1, 2, 3), 64), [], "f")
    b = Corpus(store, Target("/m/b", "builtin:tiny-chat-seed1", "c1", (1, 2, 3), 64), [], "f")
    c = Corpus(store, Target("/m/a", "builtin:tiny-chat", "c1", (1, 2, 4), 64), [], "f")
    check_same_target(a, [a])
    for other in (b, c):
        with pytest.raises(DifferentTargets, match="cannot be compared"):
            check_same_target(a, [other])


@pytest.mark.integration
def test_without_specforge_evaluate_says_what_to_install_in_one_line(tmp_path):
    """After an install without SpecForge's code: one line naming the command and the install line,
    exit 2, no traceback (and nothing read or written first)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['specforge'] = None\n"  # as if it were not installed
            "from eyrie.jobs.cli import main\n"
            f"main(['evaluate', {str(tmp_path / 'out')!r}])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("eyrie evaluate: ") and "pip install --no-deps specforge==0.2.0" in lines[0]
    assert "eyrie[specforge]" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_difference_too_small_to_separate_says_how_many_prompts_to_generate():
    """"about N held-out samples would separate" turned into what to do: how many more prompts the
    reference output needs (its held-out share and its samples per prompt), or a larger --heldout."""
    from eyrie.jobs.evaluate.run import Trained, document

    c1, d = _counts(20, [0.6, 0.5, 0.4], seed=1)
    c2, _ = _counts(20, [0.58, 0.5, 0.4], seed=2)
    trained = [Trained("ref", "reference", "file:///ref", {}, [1.0], c1, d, {}),
               Trained("other", "against", "file:///other", {}, [1.0], c2, d, {})]
    inputs = [{"uri": "file:///ref", "fingerprint": "a", "samples": 100, "prompts": 125},
              {"uri": "file:///other", "fingerprint": "b", "samples": 100, "prompts": 125}]
    doc = document("k", {}, inputs, {"samples": 20}, {"seed": 0}, False, "cpu", trained)
    diff = doc["differences"][0]
    need = diff["samplesToSeparate"]
    assert need and need > 20 and not diff["separates"]
    samples = -(-need * 100 // 20)  # the held-out share stays a fifth
    prompts = -(-(samples - 100) * 125 // 100)  # 1.25 prompts per kept sample
    assert f"generate about {prompts:,} more prompts" in doc["verdict"], doc["verdict"]
    from eyrie.jobs.spec import MIN_TRAIN

    assert ("--heldout" in doc["verdict"]) == (need < 100 - MIN_TRAIN)  # only when the samples it has can


def test_the_evaluate_tables_fit_100_columns_with_every_name_whole():
    from rich.console import Console

    from eyrie.jobs.cli.evaluate import tables
    from eyrie.jobs.intervals import Estimate

    e = Estimate(6.243, 5.881, 6.592, 60).to_dict()
    acc = {"accByPosition": [Estimate(0.912, 0.9, 0.93, 60).to_dict()] * 7, "acceptedLength": e}
    names = ["quickstart", "quickstart-impostor-seed1-long", "control: shuffled tokens"]
    doc = {"heldout": {"samples": 60, "uri": "file:///work/examples/eyrie-out/quickstart", "tokens": 12345},
           "specforgeVersion": "0.2.0",
           "drafters": [{"name": n, "training": {"samples": 240, "passes": 3.2}, "loss": [[300, 1.234]],
                         "acceptance": acc} for n in names],
           "differences": [{"name": n, "minusReference": Estimate(-0.913, -1.142, -0.688, 60).to_dict()}
                           for n in names[1:]]}
    console = Console(width=100, record=True)
    for t in tables(doc):
        console.print(t)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    for n in names:
        assert n in text, (n, text)
    assert "acc_6" in text and "-0.913 [-1.142, -0.688]" in text and "6.243 [5.881, 6.592]" in text


def test_specforge_and_torch_notices_stay_out_of_evaluate_and_nothing_else_is_hidden():
    import warnings

    from eyrie.jobs.cli.evaluate import quiet_library_warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_library_warnings()
        warnings.warn_explicit("flash_attn is not found, falling back to flex_attention.", UserWarning,
                               "llama3_eagle.py", 33, module="specforge.modeling.draft.llama3_eagle")
        warnings.warn_explicit("To get the last learning rate computed by the scheduler, please use "
                               "`get_last_lr()`.", UserWarning, "lr_scheduler.py", 1426,
                               module="torch.optim.lr_scheduler")
        warnings.warn_explicit("something else torch says", UserWarning, "x.py", 1, module="torch.nn.modules")
        warnings.warn_explicit("eyrie's own", UserWarning, "y.py", 1, module="eyrie.jobs.evaluate.run")
    assert [str(w.message) for w in seen] == ["something else torch says", "eyrie's own"]
