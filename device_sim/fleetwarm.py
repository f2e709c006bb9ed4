"""Imported once by each fleet worker's fork server (device_sim/fleetproc.py): every run forked
from it starts with numpy, ONNX Runtime's training API (imported torch-free, as the CLI does)
and edgetrain loaded, and the watch data's recordings read. Nothing here opens a session, an
allocator or a checkpoint: the server holds no runtime, each child makes its own."""
from edgetrain import datasets
from edgetrain.ort_device import training_api

training_api()
datasets.recordings("watch")  # a fleet on the hapt data reads it in each run (about 2 s)
