"""Rewrites a quantized GGUF as F16 (1-D tensors F32), metadata copied, with the `gguf` package's
dequantize: the input llama.cpp's quantizer needs to write other types of the same weights.

    python3 scripts/gguf_to_f16.py IN.gguf OUT.gguf
"""
import sys, numpy as np, gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as T
src, dst = sys.argv[1:3]
r = GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = GGUFWriter(dst, arch)
for name, f in r.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture" or name == "general.file_type":
        continue
    vt = f.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        w.add_key_value(name, f.contents(), vt, sub_type=f.types[-1])
    else:
        w.add_key_value(name, f.contents(), vt)
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
for t in r.tensors:
    x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    shape = tuple(int(d) for d in reversed(t.shape))
    x = x.reshape(shape)
    if len(shape) == 1:
        w.add_tensor(t.name, x)
    else:
        w.add_tensor(t.name, x.astype(np.float16))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
