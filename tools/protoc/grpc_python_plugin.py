"""A protoc plugin that runs grpc_tools' built-in grpc_python generator on a CodeGeneratorRequest.

buf cannot reach remote plugins here and grpc_tools ships the generator inside its protoc, so this
plugin re-runs that protoc on the request's files (their sources are in the request) and answers with
the generated `*_pb2_grpc.py` files.
"""

import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc


def main() -> None:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse()
    response.supported_features = plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    with tempfile.TemporaryDirectory() as tmp:
        descriptor_set = Path(tmp) / "set.pb"
        descriptor_set.write_bytes(descriptor_pb2.FileDescriptorSet(file=request.proto_file).SerializeToString())
        out = Path(tmp) / "out"
        out.mkdir()
        args = ["protoc", f"--descriptor_set_in={descriptor_set}", f"--grpc_python_out={out}"]
        if protoc.main([*args, *request.file_to_generate]) != 0:
            response.error = "grpc_tools.protoc failed"
        else:
            for path in sorted(out.rglob("*.py")):
                generated = response.file.add()
                generated.name = str(path.relative_to(out))
                generated.content = path.read_text()
    sys.stdout.buffer.write(response.SerializeToString())


if __name__ == "__main__":
    main()
