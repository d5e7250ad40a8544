"""HTTP routes: one small router per task. They validate, pick the model, and hand over
to the model's engine; ``common`` holds what they share."""
