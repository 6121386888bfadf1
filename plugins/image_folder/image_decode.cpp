#include "image_decode.hpp"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <limits>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "kiln_plugins/one_line.hpp"

namespace kiln_image {

namespace {

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw ImageError("'" + kiln_plugins::one_line(name) + "': " + what);
}

void check_size(const std::string& name, uint64_t width, uint64_t height, uint64_t max_pixels) {
  if (width == 0 || height == 0) fail(name, "the image has no pixels (" + std::to_string(width) + "x" +
                                                std::to_string(height) + ")");
  if (width * height > max_pixels)
    fail(name, "the image is " + std::to_string(width) + "x" + std::to_string(height) + ", over the " +
                   std::to_string(max_pixels) + " pixels kiln_image_folder decodes (PIL's decompression-bomb limit)");
}

// --- JPEG ---------------------------------------------------------------------
//
// libjpeg reports errors by calling error_exit, which must not return:
// it longjmps back to decode_jpeg_frame. That frame holds no object with a
// destructor (C++ would skip it), only the C structs and what `out` points to.

struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings: data that ends early is an error (libjpeg would fill the rest
// with grey, a silent hole); the rest (extra bytes between markers, which
// cameras write and PIL accepts) is not.
void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
    std::snprintf(errors->message, sizeof errors->message, "the JPEG data ends early (a truncated file)");
    std::longjmp(errors->jump, 1);
  }
}

struct JpegHeader {
  int width = 0, height = 0, channels = 0;
  bool cmyk = false;
};

// 0 on success; else errors.message says why. `pixels` is resized here.
int decode_jpeg_frame(const uint8_t* data, size_t size, uint64_t max_pixels, std::vector<uint8_t>* pixels,
                      JpegHeader* header, JpegErrors* errors) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = jpeg_error_exit;
  errors->mgr.emit_message = jpeg_emit_message;
  errors->message[0] = '\0';
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, const_cast<unsigned char*>(data), static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  // Refuse the size before jpeg_start_decompress: a progressive frame's
  // coefficient buffers for the whole image are allocated there, so a header
  // claiming a huge image would cost memory before any size check after it.
  if (uint64_t{cinfo.image_width} * cinfo.image_height > max_pixels || cinfo.image_width == 0 ||
      cinfo.image_height == 0) {
    header->width = static_cast<int>(cinfo.image_width);
    header->height = static_cast<int>(cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    return 0;  // the caller refuses the size
  }
  // And a bound on what libjpeg allocates for one image within that size
  // (coefficients and sampling buffers): a few bytes per pixel and component.
  cinfo.mem->max_memory_to_use = static_cast<long>(std::min<uint64_t>(
      max_pixels * 64 + (uint64_t{64} << 20), static_cast<uint64_t>(std::numeric_limits<long>::max())));
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    header->cmyk = true;
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }
  cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  header->width = static_cast<int>(cinfo.output_width);
  header->height = static_cast<int>(cinfo.output_height);
  header->channels = cinfo.output_components;
  if (uint64_t{cinfo.output_width} * cinfo.output_height > max_pixels || cinfo.output_width == 0) {
    jpeg_destroy_decompress(&cinfo);
    return 0;  // the caller refuses the size
  }
  const size_t stride = static_cast<size_t>(cinfo.output_width) * cinfo.output_components;
  pixels->resize(stride * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels->data() + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return 0;
}

Image decode_jpeg(const std::string& bytes, const std::string& name, uint64_t max_pixels) {
  Image image;
  JpegHeader header;
  JpegErrors errors;
  if (decode_jpeg_frame(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), max_pixels, &image.pixels, &header, &errors) != 0)
    fail(name, std::string("not a readable JPEG: ") + errors.message);
  if (header.cmyk) fail(name, "a CMYK JPEG: kiln_image_folder reads greyscale and RGB JPEGs; convert it to RGB");
  check_size(name, static_cast<uint64_t>(header.width), static_cast<uint64_t>(header.height), max_pixels);
  image.width = header.width;
  image.height = header.height;
  image.channels = header.channels;
  return image;
}

// --- PNG ----------------------------------------------------------------------
//
// The same shape as JPEG: libpng longjmps to png_jmpbuf on an error.

struct PngSource {
  const uint8_t* data;
  size_t size, offset;
  char message[256];
};

void png_read_from_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (length > source->size - source->offset) png_error(png, "the PNG data ends early (a truncated file)");
  std::memcpy(out, source->data + source->offset, length);
  source->offset += length;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->message, sizeof source->message, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

struct PngHeader {
  uint32_t width = 0, height = 0;
  int channels = 0;
};

int decode_png_frame(PngSource* source, uint64_t max_pixels, std::vector<uint8_t>* pixels,
                     std::vector<png_bytep>* rows, PngHeader* header) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, source, png_on_error, png_on_warning);
  if (!png) {
    std::snprintf(source->message, sizeof source->message, "out of memory");
    return 1;
  }
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    return 1;
  }
  png_set_read_fn(png, source, png_read_from_memory);
  // The size limit is max_pixels, checked below before allocating.
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  header->width = png_get_image_width(png, info);
  header->height = png_get_image_height(png, info);
  if (uint64_t{header->width} * header->height > max_pixels || header->width == 0 || header->height == 0) {
    png_destroy_read_struct(&png, &info, nullptr);
    return 0;  // the caller refuses the size
  }
  // To 8-bit grey, grey+alpha, RGB or RGBA, as PIL's modes L, LA, RGB, RGBA:
  // palettes expanded, low bit depths scaled up, tRNS as alpha, 16 bits to
  // their high byte. No gamma or colour-space conversion: PIL does none.
  png_set_expand(png);
  png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  header->channels = png_get_channels(png, info);
  const size_t stride = png_get_rowbytes(png, info);
  if (stride != size_t{header->width} * static_cast<size_t>(header->channels)) {
    std::snprintf(source->message, sizeof source->message, "an unexpected row layout after expansion");
    png_destroy_read_struct(&png, &info, nullptr);
    return 1;
  }
  pixels->resize(stride * header->height);
  rows->resize(header->height);
  for (uint32_t y = 0; y < header->height; ++y) (*rows)[y] = pixels->data() + stride * y;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return 0;
}

Image decode_png(const std::string& bytes, const std::string& name, uint64_t max_pixels) {
  PngSource source{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0, {0}};
  Image image;
  std::vector<png_bytep> rows;
  PngHeader header;
  if (decode_png_frame(&source, max_pixels, &image.pixels, &rows, &header) != 0)
    fail(name, std::string("not a readable PNG: ") + source.message);
  check_size(name, header.width, header.height, max_pixels);
  image.width = static_cast<int>(header.width);
  image.height = static_cast<int>(header.height);
  image.channels = header.channels;
  return image;
}

bool starts_with(const std::string& bytes, const char* magic, size_t n) {
  return bytes.size() >= n && std::memcmp(bytes.data(), magic, n) == 0;
}

}  // namespace

Image convert_channels(Image in, int channels) {
  if (in.channels == channels) return in;
  Image out(in.width, in.height, channels);
  const size_t n = static_cast<size_t>(in.width) * in.height;
  const uint8_t* s = in.pixels.data();
  uint8_t* d = out.pixels.data();
  const int c = in.channels;
  const bool colour = c >= 3, alpha = c == 2 || c == 4;
  for (size_t i = 0; i < n; ++i, s += c, d += channels) {
    if (channels == 1) {
      // PIL's L24: ITU-R 601-2 luma in 16-bit fixed point, rounded.
      d[0] = colour ? static_cast<uint8_t>((s[0] * 19595u + s[1] * 38470u + s[2] * 7471u + 0x8000u) >> 16) : s[0];
    } else {
      d[0] = s[0];
      d[1] = colour ? s[1] : s[0];
      d[2] = colour ? s[2] : s[0];
      if (channels == 4) d[3] = alpha ? s[c - 1] : 255;
    }
  }
  return out;
}

Image decode_image(const std::string& bytes, const std::string& name, int channels, uint64_t max_pixels) {
  Image image;
  if (starts_with(bytes, "\xff\xd8\xff", 3)) {
    image = decode_jpeg(bytes, name, max_pixels);
  } else if (starts_with(bytes, "\x89PNG\r\n\x1a\n", 8)) {
    image = decode_png(bytes, name, max_pixels);
  } else if (bytes.empty()) {
    fail(name, "the file is empty");
  } else {
    fail(name, "neither a JPEG nor a PNG file (by its first bytes); kiln_image_folder reads those two");
  }
  return convert_channels(std::move(image), channels);
}

}  // namespace kiln_image
