"""Confirm llama.cpp's cause D by replaying its trace: the reference conforms; a copy of the reference with
llama.cpp's divide sign (keys re-rotated by p_old - p_new, repro_seq_div_sign.py) diverges at the step llama.cpp
failed, with llama.cpp's own logit (0.19731 here, 0.19738 from llama.cpp in float32 under flash attention).

    python docs/llama-cpp/confirm_cause_d.py [TRACE]    # default: traces/cause-d-divide-then-mixed-batch.json
Runs from a clone (it builds the copy with tests/mutants.py); needs no llama.cpp.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.mutants import Mutant, build  # noqa: E402

TRACE = Path(__file__).with_name("traces") / "cause-d-divide-then-mixed-batch.json"

OLD = '        self._move(seq, self._in_range(p0, p1, "seq_divide")[stream], self.positions[stream] // d)\n'
NEW = ('        chosen = self._in_range(p0, p1, "seq_divide")[stream] & self.members[stream, :, seq]\n'
       '        new = self.positions[stream] // d\n'
       '        self._move(seq, chosen, 2 * self.positions[stream] - new)  # rotated by p_old - p_new (llama.cpp)\n'
       '        self.positions[stream][chosen] = new[chosen]\n')
mutant = Mutant("divide_sign_as_llama_cpp", "model.py", ((OLD, NEW),), "llama.cpp's pos_div sign", "model",
                factory="model_conformance:make_model_adapter")
copies = Path(__import__("tempfile").mkdtemp())
spec = build(mutant, copies)
trace = sys.argv[1] if len(sys.argv) > 1 else str(TRACE)
for impl in ("impl.model_conformance:make_model_adapter", spec):
    done = subprocess.run([sys.executable, "-m", "kvcache_conformance.traces.replay", "--kv-impl", impl, trace],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": f"{copies}:{ROOT}"})
    print(f"== {impl}\n" + "\n".join(done.stdout.splitlines()[-6:]))
