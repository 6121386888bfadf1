// An empty file: the target that precompiles <torch/torch.h> once for every
// plugin of kiln's own build (KILN_PCH in CMakeLists.txt) needs one source.
