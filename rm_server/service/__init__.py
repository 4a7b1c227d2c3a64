"""The only package that speaks gRPC: servicers, the error interceptor and the
protobuf <-> domain conversion (`convert`)."""
