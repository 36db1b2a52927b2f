# Writes OUT, a C file defining NAME (the bytes of IN, NUL-terminated) and
# NAME_len (their count): how the dashboard's page is built into sluice.
#   cmake -DIN=file -DOUT=file.c -DNAME=symbol -P tools/embed_file.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," arr "${hex}")
file(WRITE "${OUT}"
  "/* generated from ${IN} by tools/embed_file.cmake */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${NAME}[] = {${arr}0};\n"
  "const size_t ${NAME}_len = ${len};\n")
