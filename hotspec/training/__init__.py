"""Draft-head training by self-distillation (`hotspec train-draft`).

prompt_files / prompts -> data (responses by the engine) -> features (target pass through the
engine's runner) -> vocab (draft vocabulary) -> head_init (fresh head) -> head_forward (TTT
unroll without KV cache) + losses -> trainer (loop, checkpoints) -> report; pipeline ties them.
"""
