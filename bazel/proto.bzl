"""kvrail_cc_proto: compile .proto files with Debian's /usr/bin/protoc, offline.

Bazel 4's native proto rules want a protobuf repository (downloaded); kvrail instead runs the
system protoc, whose version matches the system libprotobuf it links against.

    kvrail_cc_proto(
        name = "engine_proto",
        srcs = ["kvrail/v1/engine.proto"],
        deps = [":handshake_proto"],   # other kvrail_cc_proto targets it imports
    )

Import paths are relative to the workspace root ("proto/kvrail/v1/handshake.proto"), and so are
the generated headers ("proto/kvrail/v1/handshake.pb.h"). The macro also defines
`<name>_srcs`, a filegroup of the .proto files, for importers and for Python code generation.
"""

def kvrail_cc_proto(name, srcs, deps = [], visibility = None):
    hdrs = [s[:-len(".proto")] + ".pb.h" for s in srcs]
    ccs = [s[:-len(".proto")] + ".pb.cc" for s in srcs]
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs + [d + "_srcs" for d in deps],
        visibility = visibility,
    )
    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = hdrs + ccs,
        cmd = "/usr/bin/protoc --proto_path=. --cpp_out=$(GENDIR) " +
              " ".join(["$(location %s)" % s for s in srcs]),
        message = "protoc " + name,
    )
    native.cc_library(
        name = name,
        srcs = ccs,
        hdrs = hdrs,
        deps = deps + ["@system//:protobuf"],
        visibility = visibility,
    )
