"""What trl_compat buys, shown on the CPU: two TRL bugs, each without and with its fix.

    python examples/grpo_cpu.py                      # both fixes (tox -e example runs this)
    python examples/grpo_cpu.py logps-temperature    # one of them

For each fix, the same short GRPO run (``examples/tiny_grpo.py``: a tiny model built in code,
3 steps, a few seconds) runs twice in a fresh process: first with ``TRL_COMPAT_DISABLE=<id>``
(TRL as it is), then with the fix on. Fresh processes, because trl_compat patches TRL when TRL is
imported; an environment variable set before that is how a user switches a fix off too.

* ``pad-token`` (a crash): a tokenizer without a pad token, as GPT-2 and Llama-3 base ship.
  TRL < 0.17 dies at the first step; with the fix it trains.
* ``logps-temperature`` (silent): TRL < 0.16 samples completions at ``temperature`` (default 0.9)
  but computes the log-probs it trains on at temperature 1. Nothing fails; the run learns from a
  biased gradient. The example measures the temperature of the log-probs by value.

The pinned stack is TRL 0.15.0 and transformers 4.48.3 (``examples/requirements.txt``): both bugs are
there. Exit status 0 only if every "before" run shows its bug and every "after" run its fix.
"""

import json
import math
import os
import subprocess
import sys

TINY_GRPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_grpo.py")

FIXES = {
    "pad-token": "a tokenizer without a pad token (as GPT-2 and Llama-3 base ship)",
    "logps-temperature": "completions are sampled at temperature 0.9 (TRL's default); and the log-probs?",
}
# logps-temperature is opt-in: switched on, it changes what existing runs optimise, so trl_compat
# waits to be asked. Both of its runs ask; the "before" run then switches it off like any other fix.
EXTRA_ENV = {"logps-temperature": {"TRL_COMPAT_LOGPS_TEMPERATURE": "1"}}


def clean_environ():
    """This process's environment without any TRL_COMPAT_* setting the caller had on (strict mode,
    the guard, a disabled patch): the example shows trl_compat's defaults, whoever runs it."""
    return {name: value for name, value in os.environ.items() if not name.startswith("TRL_COMPAT_")}


def short_report():
    """The lines of ``python -m trl_compat`` a first look needs: its headline, the counts, and the
    rows of the fixes that apply to this stack (the full report lists every patch)."""
    proc = subprocess.run([sys.executable, "-m", "trl_compat", "--json"], env=clean_environ(), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"python -m trl_compat failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout)
    counts = ", ".join(f"{n} {status}" for status, n in data["counts"].items() if n)
    lines = [data["headline"], f"patches: {counts}; the fixes applied to this stack:"]
    applied = [row for row in data["patches"] if row["status"] == "applied"]
    width = max((len(row["id"]) for row in applied), default=0)
    lines += [f"  {row['id']:<{width}}  {row['summary']}" for row in applied]
    lines.append("(every patch, with its reason: python -m trl_compat)")
    return lines


def run_tiny_grpo(fix, fix_on):
    env = {**clean_environ(), **EXTRA_ENV.get(fix, {})}
    if not fix_on:
        env["TRL_COMPAT_DISABLE"] = fix
    proc = subprocess.run([sys.executable, TINY_GRPO, fix], env=env, capture_output=True, text=True)
    results = [line[len("RESULT ") :] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:  # not the bug's crash (that one is caught): the example is broken
        sys.exit(f"{TINY_GRPO} {fix} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(results[-1])


def before_after(fix):
    """The tiny GRPO run's results without the fix, then with it."""
    return run_tiny_grpo(fix, fix_on=False), run_tiny_grpo(fix, fix_on=True)


def trained(result):
    steps = result["steps"]
    return result["error"] is None and len(steps) == 3 and all(math.isfinite(step["grad_norm"]) for step in steps)


# Each show_<fix> prints the two runs side by side and returns (bug shown before, fix shown after).


def show_pad_token(before, after):
    # The error's first sentence is the line a user would search for; the rest is advice.
    print(f"  without the fix:  {(before['error'] or 'no error').split('. ')[0]}")
    outcome = f"trained {len(after['steps'])} steps" if trained(after) else after["error"]
    print(f"  with the fix:     {outcome}, the pad token set to {after['pad_token']!r} (the EOS, as TRL 0.17 does)")
    bug_shown = before["error"] is not None and "padding token" in before["error"]
    return bug_shown, trained(after) and after["pad_token"] == "</s>"


def show_logps_temperature(before, after):
    def row(name, before_value, after_value):
        print(f"  {name:<36}{before_value:<20}{after_value}")

    def temperatures(result):
        return ", ".join(f"{t:.2f}" for t in result["logps_temperatures"]) or "-"

    def norms(result):
        return " ".join(f"{step['grad_norm']:.3f}" for step in result["steps"])

    sampled = before["sampling_temperature"]
    row("", "without the fix", "with the fix")
    row("completions sampled at temperature", f"{sampled:.2f}", f"{after['sampling_temperature']:.2f}")
    row("log-probs computed at temperature", temperatures(before), temperatures(after))
    # The logged loss is no help here: at the first step of GRPO it is 0 by construction (ratio 1,
    # no KL yet), and later steps round it to 1e-4. The gradient is what the temperature changes.
    row("gradient norm, steps 1 2 3", norms(before), norms(after))
    bug_shown = sampled != 1.0 and before["logps_temperatures"] == [1.0]
    return bug_shown, trained(after) and after["logps_temperatures"] == [sampled]


SHOW = {"pad-token": show_pad_token, "logps-temperature": show_logps_temperature}


def main(fixes):
    unknown = sorted(set(fixes) - set(FIXES))
    if unknown:
        sys.exit(f"no example for {', '.join(unknown)}: choose from {', '.join(FIXES)}")
    failures = []
    print("\n".join(short_report()) + "\n")
    for number, fix in enumerate(fixes, 1):
        before, after = before_after(fix)
        if number == 1:
            print(
                f"TRL {before['trl']}, transformers {before['transformers']}, torch {before['torch']}; "
                "vLLM: none, not needed (TRL generates with transformers unless use_vllm=True)."
            )
            print("Each fix: the same 3-step GRPO run on a tiny model, first with TRL_COMPAT_DISABLE=<fix>, then with the fix on.\n")
        print(f"[{number}/{len(fixes)}] {fix}: {FIXES[fix]}")
        print(f"  trl_compat's status for it: {before['status']} (before), {after['status']} (after)")
        bug_shown, fix_shown = SHOW[fix](before, after)
        if not bug_shown:
            failures.append(f"{fix}: the run without the fix did not show the bug (TRL {before['trl']})")
        if not fix_shown:
            failures.append(f"{fix}: the run with the fix did not show it working")
        print()
    for failure in failures:
        print("FAILED " + failure)
    print("FAILED" if failures else "OK: each bug shown without its fix, and fixed with it")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(FIXES)))
