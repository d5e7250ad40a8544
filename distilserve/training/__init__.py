"""Training: distillation, fine-tuning for the embedded default, and their data."""

# the students distillation makes (distilserve/training/distill.py), here for the CLI to name without
# importing torch: each family's preset
STUDENT_PRESET = {"minialbert": "student-384", "falbert": "student-384",
                  "cmow": "cmow-hybrid-bidi", "bert": "student-3l"}
# steps of 32 sentences
DEFAULT_STEPS = {"bert": 1000, "minialbert": 800, "falbert": 1200, "cmow": 1200}
