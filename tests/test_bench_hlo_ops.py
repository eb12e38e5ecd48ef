"""bench/hlo_ops.py: naming a profile's XLA ops from an optimized-HLO dump (CPU, a fixture text)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import hlo_ops  # noqa: E402

MODULE = """HloModule jit_step, is_scheduled=true

FileNames
1 "/repo/nsa_jax/pallas/nsa.py"
2 "/usr/lib/python3/site-packages/jax/_src/numpy/reductions.py"

FunctionNames
1 "_nsa_bwd"
2 "_reduce_sum"

FileLocations
1 {file_name_id=1 function_name_id=1 line=264 end_line=264 column=4 end_column=9}
2 {file_name_id=2 function_name_id=2 line=90 end_line=90 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}
3 {file_location_id=2 parent_frame_id=2}


%fused_concatenate.71 (param_0.1: f32[4,12]) -> bf16[4,36] {
  %param_0.1 = f32[4,12]{1,0} parameter(0)
  %reduce.1 = f32[4]{0} reduce(%param_0.1), dimensions={1}, metadata={op_name="jit(step)/transpose(jvp())/reduce_sum" stack_frame_id=3}
  ROOT %concatenate.1 = bf16[4,36]{1,0} concatenate(%param_0.1), dimensions={1}, metadata={op_name="jit(step)/transpose(jvp())/stack" stack_frame_id=1}
}

ENTRY %main.1 (p: f32[4,12]) -> bf16[4,36] {
  %p = f32[4,12]{1,0} parameter(0)
  ROOT %input_concatenate_fusion.59 = bf16[4,36]{1,0} fusion(%p), kind=kInput, calls=%fused_concatenate.71, metadata={op_name="jit(step)/transpose(jvp())/stack" stack_frame_id=1}
}
"""


def test_profile_names_resolve_to_instructions_and_project_source(tmp_path):
    (tmp_path / "module_0001.jit_init.gpu_after_optimizations.txt").write_text(
        "HloModule jit_init\n\nENTRY %main (p: f32[1]) -> f32[1] {\n"
        "  ROOT %p = f32[1]{0} parameter(0)\n}\n" + "\n" * 4000)   # larger, but not the step
    (tmp_path / "module_0002.jit_step.gpu_after_optimizations.txt").write_text(MODULE)
    name = "input_concatenate_fusion_59"      # the profiler's spelling of ...fusion.59
    path = hlo_ops.pick_module(str(tmp_path), [name])
    assert path.endswith("jit_step.gpu_after_optimizations.txt")
    instrs, comps, frames = hlo_ops.parse(path)
    # a printed parent_frame_id is the parent's id + 1 (1: none). Frame 3 (jax internals) is
    # called from frame 1 (ours): the project frame names it; frame 2 has no project frame, so
    # its own location stands in
    assert frames[1] == "pallas/nsa.py:264 _nsa_bwd"
    assert frames[3] == "pallas/nsa.py:264 _nsa_bwd"
    assert "reductions.py:90" in frames[2]
    text = hlo_ops.describe(name, instrs, comps, frames)
    assert "kind=kInput" in text
    assert "transpose(jvp())/stack  [pallas/nsa.py:264 _nsa_bwd]" in text
    assert "root: ROOT %concatenate.1" in text
    assert "1x transpose(jvp())/reduce_sum  [pallas/nsa.py:264 _nsa_bwd]" in text
    assert hlo_ops.describe("loop_add_fusion_3", instrs, comps, frames).endswith("not in the module")
