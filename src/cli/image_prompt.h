// Prompts with images (--image): "<image>" in the prompt marks where each image goes; a prompt without
// markers gets its images before the text.
#pragma once
#include <string>
#include <vector>

#include "cera/session.h"

namespace cera::cli {

// The text pieces around the images: n_images + 1 of them (image i goes between pieces i and i + 1).
// Throws Error(kInvalidArgument) when the prompt has markers but not one per image.
std::vector<std::string> split_image_prompt(const std::string& prompt, size_t n_images);

// Queues the prompt's text (append_text, BOS as add_bos asks) and images (append_image_file) in order.
void queue_prompt(Session& s, const std::string& prompt, const std::vector<std::string>& images, bool add_bos,
                  bool parse_special);

}  // namespace cera::cli
