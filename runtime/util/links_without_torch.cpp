// Linked with every object of kiln_core and without LibTorch (see
// runtime/CMakeLists.txt): if any of them calls into LibTorch, this program
// does not link, and the build says which symbol. It is never run.
int main() { return 0; }
