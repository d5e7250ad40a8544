"""The Open Inference Protocol (KServe's V2, Triton's) over HTTP and gRPC: its routes and
services, bodies, tensors, model repository and error shape."""
