#include "tests/support/vectors.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvrail::testing {

nlohmann::json LoadVectors(absl::string_view file) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::string path = srcdir != nullptr ? absl::StrCat(srcdir, "/kvrail/tests/data/cachepd/", file)
                                       : absl::StrCat("tests/data/cachepd/", file);
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot open vector file %s\n", path.c_str());
    std::abort();
  }
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

std::string FromHex(absl::string_view hex) {
  if (hex.size() % 2 != 0) {
    std::fprintf(stderr, "odd-length hex in a vector\n");
    std::abort();
  }
  return absl::HexStringToBytes(hex);
}

std::string ToHex(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

std::string ExpandGenerator(const nlohmann::json& generator) {
  const std::string kind = generator.at("kind").get<std::string>();
  if (kind == "pad_right") {
    std::string out = FromHex(generator.at("base_hex").get<std::string>());
    size_t total = generator.at("total_length").get<size_t>();
    out.resize(total, static_cast<char>(generator.at("pad_byte").get<int>()));
    return out;
  }
  if (kind == "nest") {
    size_t depth = generator.at("depth").get<size_t>();
    return std::string(depth, '[') + std::string(depth, ']');
  }
  std::fprintf(stderr, "unknown vector generator %s\n", kind.c_str());
  std::abort();
}

std::string VectorInput(const nlohmann::json& entry) {
  if (entry.contains("input_hex") && entry["input_hex"].is_string()) {
    return FromHex(entry["input_hex"].get<std::string>());
  }
  if (entry.contains("input_generator") && entry["input_generator"].is_object()) {
    return ExpandGenerator(entry["input_generator"]);
  }
  if (entry.contains("input_text") && entry["input_text"].is_string()) {
    return entry["input_text"].get<std::string>();
  }
  return "";
}

std::vector<std::string> VectorFrames(const nlohmann::json& entry) {
  std::vector<std::string> frames;
  const nlohmann::json& hex = entry.at("frames_hex");
  for (size_t i = 0; i < hex.size(); ++i) {
    if (hex[i].is_null()) {
      frames.push_back(ExpandGenerator(entry.at("frame_generators").at(std::to_string(i))));
    } else {
      frames.push_back(FromHex(hex[i].get<std::string>()));
    }
  }
  return frames;
}

}  // namespace kvrail::testing
