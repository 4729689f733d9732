"""Images in: what a prompt's images become before the model sees them (torch-free).

`inputs.py`: the preprocessed image (`ImageFeatures`), a request's images and where their tokens
sit (`MultiModalInputs`), and the hash-derived placeholder ids the scheduler and the prefix cache
see in place of an image's tokens. `processor.py`: the `ImageProcessor` protocol and the one
family's processor (Qwen2-VL / Qwen2.5-VL: dynamic resolution, 14-pixel patches merged 2 x 2).
"""
