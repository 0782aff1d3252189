#include "cli/image_prompt.h"

#include "cera/error.h"

namespace cera::cli {

std::vector<std::string> split_image_prompt(const std::string& prompt, size_t n_images) {
    static const std::string kMarker = "<image>";
    std::vector<std::string> pieces;
    size_t from = 0;
    for (size_t at; (at = prompt.find(kMarker, from)) != std::string::npos; from = at + kMarker.size())
        pieces.push_back(prompt.substr(from, at - from));
    pieces.push_back(prompt.substr(from));
    if (pieces.size() == 1) {  // no markers: the images first
        pieces.assign(n_images, "");
        pieces.push_back(prompt);
    }
    if (pieces.size() != n_images + 1)
        throw Error(ErrorCode::kInvalidArgument, "the prompt has " + std::to_string(pieces.size() - 1) +
                                                     " <image> markers for " + std::to_string(n_images) + " --image");
    return pieces;
}

void queue_prompt(Session& s, const std::string& prompt, const std::vector<std::string>& images, bool add_bos,
                  bool parse_special) {
    const std::vector<std::string> pieces = split_image_prompt(prompt, images.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
        if (!pieces[i].empty() || (i == 0 && images.empty())) s.append_text(pieces[i], add_bos, parse_special);
        if (i < images.size()) s.append_image_file(images[i]);
    }
}

}  // namespace cera::cli
