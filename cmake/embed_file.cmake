# cmake -DINPUT=FILE -DOUTPUT=FILE.cpp -DNAME=ident -DNAMESPACE=ns -P embed_file.cmake
# Writes a C++ source that holds INPUT's bytes: `extern const unsigned char NAME[]` and
# `extern const size_t NAME_size` in namespace NAMESPACE. The bytes are written as hex, so any
# content (quotes, backslashes, a raw string's delimiter) embeds unchanged.
file(READ ${INPUT} hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n_bytes "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 24 bytes a line keeps the generated file readable in a diff or a debugger.
string(REPEAT "0x[0-9a-f][0-9a-f]," 24 line)
string(REGEX REPLACE "(${line})" "\\1\n    " bytes "${bytes}")
get_filename_component(input_name ${INPUT} NAME)
file(WRITE ${OUTPUT}.tmp
"// Generated at build time from ${input_name} by cmake/embed_file.cmake; do not edit.
#include <cstddef>

namespace ${NAMESPACE} {
extern const unsigned char ${NAME}[];
extern const size_t ${NAME}_size;
const unsigned char ${NAME}[] = {
    ${bytes}0x00};
const size_t ${NAME}_size = ${n_bytes};
}  // namespace ${NAMESPACE}
")
# Only a changed file is replaced, so that an unchanged page does not recompile.
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUTPUT}.tmp)
