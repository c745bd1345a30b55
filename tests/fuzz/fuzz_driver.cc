// A seeded random-mutation driver for the libFuzzer harnesses in this folder, for machines and
// builds without clang's libFuzzer (the gcc build used by `bazel test`). It feeds each seed
// file, then mutations of them (bit flips, byte edits, inserts, deletes, splices, repeats),
// to LLVMFuzzerTestOneInput for a bounded number of runs or seconds. A crash, sanitizer report
// or abort in the harness fails the test; the seed of the run is printed to reproduce it.
//
//   usage: <harness> [--runs=N] [--seconds=S] [--seed=N] SEED_FILE_OR_DIR...
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> LoadSeeds(const std::vector<std::string>& paths) {
  std::vector<std::string> seeds;
  auto load = [&seeds](const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    seeds.push_back(text.str());
  };
  for (const std::string& path : paths) {
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) load(entry.path());
      }
    } else if (std::filesystem::is_regular_file(path)) {
      load(path);
    }
  }
  if (seeds.empty()) seeds.push_back("");
  return seeds;
}

std::string Mutate(const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  std::string data = seeds[rng() % seeds.size()];
  const int edits = 1 + static_cast<int>(rng() % 8);
  static const char kTokens[] = "{}[]\",:0123456789-+.eE \n\\u\x00\xff";
  for (int e = 0; e < edits; ++e) {
    const size_t at = data.empty() ? 0 : rng() % (data.size() + 1);
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!data.empty()) {
          char& byte = data[at % data.size()];
          byte = static_cast<char>(static_cast<unsigned char>(byte) ^ (1u << (rng() % 8)));
        }
        break;
      case 1:  // replace a byte
        if (!data.empty()) data[at % data.size()] = static_cast<char>(rng() % 256);
        break;
      case 2:  // insert a JSON-ish token
        data.insert(at, 1, kTokens[rng() % (sizeof(kTokens) - 1)]);
        break;
      case 3:  // delete a run
        if (at < data.size()) data.erase(at, 1 + rng() % 16);
        break;
      case 4: {  // splice another seed
        const std::string& other = seeds[rng() % seeds.size()];
        if (!other.empty()) {
          size_t from = rng() % other.size();
          data.insert(at, other.substr(from, 1 + rng() % 64));
        }
        break;
      }
      case 5:  // repeat a run
        if (at < data.size()) data.insert(at, data.substr(at, 1 + rng() % 32));
        break;
      default:  // truncate
        data.resize(at);
    }
  }
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t runs = 20000;
  double seconds = 30;
  uint64_t seed = 20261130;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--runs=", 7) == 0) {
      runs = std::strtoll(argv[i] + 7, nullptr, 10);
    } else if (std::strncmp(argv[i], "--seconds=", 10) == 0) {
      seconds = std::atof(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--seed=", 7) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else {
      paths.push_back(argv[i]);
    }
  }
  const std::vector<std::string> seeds = LoadSeeds(paths);
  std::printf("fuzz driver: %zu seeds, up to %" PRId64 " runs or %.0f s, seed %" PRIu64 "\n",
              seeds.size(), runs, seconds, seed);
  std::fflush(stdout);
  for (const std::string& s : seeds) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::mt19937_64 rng(seed);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int64_t done = 0;
  for (; done < runs && std::chrono::steady_clock::now() < deadline; ++done) {
    const std::string input = Mutate(seeds, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  }
  std::printf("fuzz driver: %" PRId64 " runs, no failure\n", done);
  return 0;
}
