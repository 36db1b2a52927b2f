/* The mixture-of-experts FFN on the CPU (src/model/llama_moe.c), on a tiny
 * qwen3moe file this test writes (gate and up experts in Q8_0, down experts
 * in Q4_K, so the packed kernels run where the ISA has them; the rest F32),
 * at every ISA level this CPU runs (SLUICE_ISA: one):
 *  - routing: the top k in a fixed order, the lowest index on a tie, the
 *    weights renormalised or not and scaled as the hyper-parameters say;
 *  - the grouped products against a float64 computation from the
 *    dequantized expert slices (the loader's views of the 3-D tensors, the
 *    weights, the sum), and a token's output alone and among 12 tokens,
 *    bit for bit;
 *  - a sequence's logits alone and in a batch of 16, prefill and decode
 *    steps, bit for bit (DESIGN.md I9).
 * Against llama.cpp (and qwen3moe and Mixtral files in other formats):
 * tests/py/test_model_moe.py. Here is what runs under ASan and UBSan. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "isa_levels.h"
#include "model/llama_impl.h"
#include "rand_weights.h"
#include "sluice/kern_cpu.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/rt.h"
#include "sluice/util.h"

/* top-3: with two experts the order of their sum could not show (a + b is
 * b + a) */
enum { D = 64, NL = 2, NH = 4, NKV = 2, HD = 16, NE = 8, NK = 3, FF = 256 };
enum { NV = 96, BT_DESC = 16 };

/* ---- a GGUF v3 writer, just enough for this file ---- */

typedef struct wbuf {
  uint8_t *p;
  size_t n, cap;
} wbuf;

static void put(wbuf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void put_u32(wbuf *b, uint32_t v) {
  put(b, &v, 4);
}
static void put_u64(wbuf *b, uint64_t v) {
  put(b, &v, 8);
}
static void put_str(wbuf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void kv_u32(wbuf *b, const char *k, uint32_t v) {
  put_str(b, k);
  put_u32(b, 4); /* GGUF_TYPE_UINT32 */
  put_u32(b, v);
}
static void kv_f32(wbuf *b, const char *k, float v) {
  put_str(b, k);
  put_u32(b, 6); /* GGUF_TYPE_FLOAT32 */
  put(b, &v, 4);
}

typedef struct wtensor {
  char name[64];
  uint32_t n_dims;
  uint64_t ne[3];
  sl_ggml_type type;
  size_t bytes;
  uint8_t *data;
} wtensor;

static wtensor g_t[64];
static int g_nt;

static float frand(void) {
  return rw_unif(-1.0f, 1.0f);
}

/* A tensor of ne[0] × ne[1] × ne[2] (cols first) of type t, random: F32
 * values uniform in ±scale (norms: 1 ± scale), quantized blocks from
 * rand_weights.h. */
static void add_tensor(const char *name, sl_ggml_type t, uint64_t ne0,
                       uint64_t ne1, uint64_t ne2, float scale, bool norm) {
  wtensor *w = &g_t[g_nt++];
  snprintf(w->name, sizeof w->name, "%s", name);
  w->n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
  w->ne[0] = ne0, w->ne[1] = ne1, w->ne[2] = ne2;
  w->type = t;
  size_t rb;
  CHECK_OK(sl_kern_row_bytes(t, (int64_t)ne0, &rb));
  w->bytes = rb * ne1 * ne2;
  w->data = malloc(w->bytes);
  if (t == SL_GGML_F32) {
    float *f = (float *)w->data;
    for (size_t i = 0; i < ne0 * ne1 * ne2; i++)
      f[i] = norm ? 1.0f + scale * frand() : scale * frand();
  } else {
    rw_fill_weight(t, w->data, w->bytes);
  }
}

/* Writes the model to `path`. */
static void write_model(const char *path) {
  g_nt = 0;
  char n[64];
  add_tensor("token_embd.weight", SL_GGML_F32, D, NV, 1, 1.0f, false);
  add_tensor("output_norm.weight", SL_GGML_F32, D, 1, 1, 0.1f, true);
  add_tensor("output.weight", SL_GGML_F32, D, NV, 1, 0.2f, false);
  for (int l = 0; l < NL; l++) {
#define T(nm, ty, a, b, c, s, nrm)                                             \
  snprintf(n, sizeof n, "blk.%d." nm, l);                                      \
  add_tensor(n, ty, a, b, c, s, nrm)
    T("attn_norm.weight", SL_GGML_F32, D, 1, 1, 0.1f, true);
    T("attn_q.weight", SL_GGML_F32, D, NH * HD, 1, 0.2f, false);
    T("attn_k.weight", SL_GGML_F32, D, NKV * HD, 1, 0.2f, false);
    T("attn_v.weight", SL_GGML_F32, D, NKV * HD, 1, 0.2f, false);
    T("attn_output.weight", SL_GGML_F32, NH * HD, D, 1, 0.2f, false);
    T("attn_q_norm.weight", SL_GGML_F32, HD, 1, 1, 0.1f, true);
    T("attn_k_norm.weight", SL_GGML_F32, HD, 1, 1, 0.1f, true);
    T("ffn_norm.weight", SL_GGML_F32, D, 1, 1, 0.1f, true);
    T("ffn_gate_inp.weight", SL_GGML_F32, D, NE, 1, 0.5f, false);
    T("ffn_gate_exps.weight", SL_GGML_Q8_0, D, FF, NE, 0, false);
    T("ffn_up_exps.weight", SL_GGML_Q8_0, D, FF, NE, 0, false);
    T("ffn_down_exps.weight", SL_GGML_Q4_K, FF, D, NE, 0, false);
#undef T
  }
  wbuf b = {0};
  put(&b, "GGUF", 4);
  put_u32(&b, 3);
  put_u64(&b, (uint64_t)g_nt);
  put_u64(&b, 11);
  put_str(&b, "general.architecture");
  put_u32(&b, 8); /* GGUF_TYPE_STRING */
  put_str(&b, "qwen3moe");
  kv_u32(&b, "qwen3moe.context_length", 256);
  kv_u32(&b, "qwen3moe.embedding_length", D);
  kv_u32(&b, "qwen3moe.block_count", NL);
  kv_u32(&b, "qwen3moe.attention.head_count", NH);
  kv_u32(&b, "qwen3moe.attention.head_count_kv", NKV);
  kv_u32(&b, "qwen3moe.attention.key_length", HD);
  kv_f32(&b, "qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
  kv_u32(&b, "qwen3moe.expert_count", NE);
  kv_u32(&b, "qwen3moe.expert_used_count", NK);
  kv_u32(&b, "qwen3moe.expert_feed_forward_length", FF);
  uint64_t off = 0;
  for (int i = 0; i < g_nt; i++) {
    put_str(&b, g_t[i].name);
    put_u32(&b, g_t[i].n_dims);
    for (uint32_t k = 0; k < g_t[i].n_dims; k++)
      put_u64(&b, g_t[i].ne[k]);
    put_u32(&b, (uint32_t)g_t[i].type);
    put_u64(&b, off);
    off += (g_t[i].bytes + 31) & ~(size_t)31;
  }
  static const uint8_t zero[32];
  put(&b, zero, (32 - b.n % 32) % 32);
  for (int i = 0; i < g_nt; i++) {
    put(&b, g_t[i].data, g_t[i].bytes);
    put(&b, zero, (32 - g_t[i].bytes % 32) % 32);
    free(g_t[i].data);
  }
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (f) {
    CHECK(fwrite(b.p, 1, b.n, f) == b.n);
    fclose(f);
  }
  free(b.p);
}

static char g_path[256];

static sl_model_t *load(void) {
  char err[256];
  sl_status st;
  sl_model_t *m = sl_model_load(g_path, &st, err, sizeof err);
  CHECK_MSG(m != NULL, "%s", err);
  return m;
}

/* ---- routing ---- */

static void test_route_order_and_weights(void) {
  sl__ffn_desc hp = {.kind = SL__FFN_MOE, .n_expert = 6, .n_used = 3};
  hp.norm_weights = true;
  hp.weight_scale = 1.0f;
  /* three-way tie at 3 (experts 1, 2, 4) above 2 (5) */
  float lg[6] = {1, 3, 3, 0, 3, 2};
  int32_t sel[3];
  float wt[3];
  sl__moe_route(&hp, lg, sel, wt);
  CHECK(sel[0] == 1 && sel[1] == 2 && sel[2] == 4);
  for (int j = 0; j < 3; j++)
    CHECK_MSG(fabsf(wt[j] - 1.0f / 3) < 1e-6f, "wt %g", wt[j]);
  /* a tie across the cut: 5 at 0, 2 and 3, two taken: the lowest first,
   * the result in expert order */
  hp.n_used = 2;
  float lg2[6] = {5, 1, 5, 5, 0, 4};
  sl__moe_route(&hp, lg2, sel, wt);
  CHECK(sel[0] == 0 && sel[1] == 2);
  /* unnormalised and scaled: softmax probabilities times the scale */
  hp.norm_weights = false;
  hp.weight_scale = 2.5f;
  float lg3[6] = {0, 2, 1, -1, 4, 0}, p[6];
  memcpy(p, lg3, sizeof p);
  sl_kern_softmax(p, 6);
  sl__moe_route(&hp, lg3, sel, wt);
  CHECK(sel[0] == 1 && sel[1] == 4);
  CHECK(fabsf(wt[0] - 2.5f * p[1]) < 1e-6f &&
        fabsf(wt[1] - 2.5f * p[4]) < 1e-6f);
  /* NaN router logits: no crash, k distinct experts in range */
  hp.n_used = 3;
  float lg4[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
  sl__moe_route(&hp, lg4, sel, wt);
  CHECK(sel[0] >= 0 && sel[0] < sel[1] && sel[1] < sel[2] && sel[2] < 6);
}

/* ---- each layer described as data ---- */

/* Sets the one feature `bit` in layer 1's description (or the model's). */
static void set_feature(sl_model_t *m, uint32_t bit) {
  sl__layer_desc *ld = &m->ld[1];
  switch (bit) {
  case SL__F_QKV_BIAS:
    ld->attn.qkv_bias = true;
    break;
  case SL__F_QK_NORM:
    ld->attn.qk_norm = true;
    break;
  case SL__F_MOE:
    ld->ffn.kind = SL__FFN_MOE;
    break;
  case SL__F_SHARED_EXPERTS:
    ld->ffn.n_shared = 1;
    break;
  case SL__F_GATING_SIGMOID:
    ld->ffn.gating = SL__GATING_SIGMOID;
    break;
  case SL__F_WINDOW:
    ld->attn.window = 128;
    break;
  case SL__F_SINKS:
    ld->attn.sinks = true;
    break;
  case SL__F_ATTN_SOFTCAP:
    ld->attn.softcap = 50.0f;
    break;
  case SL__F_O_BIAS:
    ld->attn.o_bias = true;
    break;
  case SL__F_POST_NORMS:
    ld->post_ffn_norm = true;
    break;
  case SL__F_LAYER_NORM:
    ld->norm.kind = SL__NORM_LAYER;
    break;
  case SL__F_NORM_OFFSET:
    ld->norm.offset = 1.0f;
    break;
  case SL__F_GELU:
    ld->ffn.act = SL__ACT_GELU;
    break;
  case SL__F_UNGATED_FFN:
    ld->ffn.gated = false;
    break;
  case SL__F_EMBD_SCALE:
    m->md.embd_scale = 8.0f;
    break;
  case SL__F_OUT_SOFTCAP:
    m->md.out_softcap = 30.0f;
    break;
  }
}

/* The description the loader built from the metadata, the features it
 * uses, and a context refused on a pass that lacks a feature a layer uses:
 * every feature the CPU pass lacks, one at a time, names the architecture,
 * the layer, the feature and the device; and CUDA refuses the experts. */
static void test_layer_desc(void) {
  sl_model_t *m = load();
  if (!m)
    return;
  for (int l = 0; l < NL; l++) {
    const sl__layer_desc *ld = &m->ld[l];
    CHECK(ld->norm.kind == SL__NORM_RMS && ld->norm.eps == 1e-6f &&
          ld->norm.offset == 0);
    CHECK(ld->attn.n_head == NH && ld->attn.n_head_kv == NKV &&
          ld->attn.head_dim == HD && ld->attn.window == 0 &&
          ld->attn.softcap == 0 && !ld->attn.sinks);
    CHECK(ld->attn.scale == 1.0f / sqrtf((float)HD));
    CHECK(ld->attn.rope.mode == SL_KERN_ROPE_NEOX &&
          ld->attn.rope.n_dims == HD && ld->attn.rope.base == 10000.0f);
    CHECK(ld->attn.qk_norm && !ld->attn.qkv_bias);
    CHECK(ld->ffn.kind == SL__FFN_MOE && ld->ffn.n_expert == NE &&
          ld->ffn.n_used == NK && ld->ffn.n_ff == FF && ld->ffn.gated &&
          ld->ffn.norm_weights && ld->ffn.weight_scale == 1.0f &&
          ld->ffn.gating == SL__GATING_SOFTMAX);
    CHECK_EQ_INT(sl__layer_features(ld), SL__F_QK_NORM | SL__F_MOE);
  }
  CHECK_EQ_INT(sl__model_desc_features(&m->md), 0);
  CHECK(strcmp(m->md.arch, "qwen3moe") == 0);
  char err[256];
  CHECK_OK(sl__model_check(m, SL__CPU_FEATURES, "CPU", err, sizeof err));
  CHECK(sl__model_check(m, SL__CUDA_FEATURES, "CUDA", err, sizeof err) ==
        SL_ERR_UNSUPPORTED);
  CHECK_MSG(strcmp(err, "qwen3moe: layer 0 uses routed experts "
                        "(mixture-of-experts), which the CUDA forward pass "
                        "does not implement yet") == 0,
            "%s", err);
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  sl_stream_t *s = sl_thread_stream(sl_cpu_device());
  sl_kv_view kv = {NULL, NL, 4, BT_DESC, (int)(hp->n_head_kv * HD)};
  CHECK_OK(sl_buf_alloc(s, sl_kv_view_bytes(&kv), &kv.buf));
  sl__model_desc md0 = m->md;
  sl__layer_desc ld0 = m->ld[1];
  int refused = 0;
  for (int f = 0; f < SL__F_COUNT; f++) {
    uint32_t bit = 1u << f;
    if (bit & SL__CPU_FEATURES)
      continue;
    set_feature(m, bit);
    sl_batch_ctx_t *bc = NULL;
    err[0] = 0;
    sl_status st = sl_batch_ctx_create2(m, &kv, s, 1, &bc, err, sizeof err);
    CHECK_MSG(st == SL_ERR_UNSUPPORTED && bc == NULL, "feature %s: status %d",
              sl__feature_name(bit), (int)st);
    bool model_part = bit == SL__F_EMBD_SCALE || bit == SL__F_OUT_SOFTCAP;
    CHECK_MSG(strstr(err, "qwen3moe") && strstr(err, sl__feature_name(bit)) &&
                  strstr(err, "CPU forward pass") &&
                  (model_part || strstr(err, "layer 1 uses")),
              "feature %s: '%s'", sl__feature_name(bit), err);
    sl_batch_ctx_free(bc);
    refused++;
    m->md = md0;
    m->ld[1] = ld0;
  }
  CHECK_EQ_INT(refused, SL__F_COUNT - 3);
  sl_batch_ctx_t *bc = NULL; /* restored: made */
  CHECK_OK(sl_batch_ctx_create2(m, &kv, s, 1, &bc, err, sizeof err));
  sl_batch_ctx_free(bc);
  sl_buf_release(kv.buf);
  sl_sync_and_clear_cache(s);
  sl_model_free(m);
}

/* ---- the grouped products ---- */

/* Expert e's matrix of the 3-D tensor blk.<l>.<name>, read from the file's
 * tensor itself (not the loader's views), rows of `cols`. */
static const char *expert_rows(const sl_model_t *m, int l, const char *name,
                               int e, int64_t rows, int64_t cols,
                               sl_ggml_type *type, size_t *rb) {
  char full[96];
  snprintf(full, sizeof full, "blk.%d.%s", l, name);
  const sl_gguf_tensor *t = sl_gguf_find_tensor(sl_model_gguf(m), full);
  CHECK(t != NULL);
  *type = t->type;
  CHECK_OK(sl_kern_row_bytes(t->type, cols, rb));
  return (const char *)t->data + (size_t)e * (size_t)rows * *rb;
}

/* out (d) in float64 from the file's dequantized expert slices: the sum
 * over the token's experts of w * down(silu(gate x) * up x). */
static void ref_ffn(const sl_model_t *m, int l, const float *x, double *out) {
  float lg[NE], wt[NK], row[FF];
  int32_t sel[NK];
  sl_ggml_type ty;
  size_t rb;
  const char *r = expert_rows(m, l, "ffn_gate_inp.weight", 0, NE, D, &ty, &rb);
  for (int e = 0; e < NE; e++) {
    CHECK_OK(sl_kern_dequant_row(ty, r + e * rb, row, D));
    double s = 0;
    for (int i = 0; i < D; i++)
      s += (double)row[i] * x[i];
    lg[e] = (float)s;
  }
  sl__moe_route(&m->ld[l].ffn, lg, sel, wt);
  for (int i = 0; i < D; i++)
    out[i] = 0;
  for (int j = 0; j < NK; j++) {
    int e = sel[j];
    double h[FF];
    const char *g = expert_rows(m, l, "ffn_gate_exps.weight", e, FF, D, &ty,
                                &rb),
               *u = expert_rows(m, l, "ffn_up_exps.weight", e, FF, D, &ty, &rb);
    for (int f = 0; f < FF; f++) {
      double a = 0, c = 0;
      CHECK_OK(sl_kern_dequant_row(ty, g + f * rb, row, D));
      for (int i = 0; i < D; i++)
        a += (double)row[i] * x[i];
      CHECK_OK(sl_kern_dequant_row(ty, u + f * rb, row, D));
      for (int i = 0; i < D; i++)
        c += (double)row[i] * x[i];
      h[f] = a / (1 + exp(-a)) * c;
    }
    const char *dn =
        expert_rows(m, l, "ffn_down_exps.weight", e, D, FF, &ty, &rb);
    for (int i = 0; i < D; i++) {
      CHECK_OK(sl_kern_dequant_row(ty, dn + i * rb, row, FF));
      double s = 0;
      for (int f = 0; f < FF; f++)
        s += (double)row[f] * h[f];
      out[i] += wt[j] * s;
    }
  }
}

static void test_grouped_products(sl_kern_isa isa) {
  sl_model_t *m = load();
  if (!m)
    return;
  sl_kern_pool_t *pool = sl_kern_pool_create(2);
  sl__model_repack(m); /* the packed layouts, as a batch context does */
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  CHECK_EQ_INT(hp->n_expert, NE);
  CHECK_EQ_INT(hp->n_expert_used, NK);
  CHECK_EQ_INT(hp->n_ff_exp, FF);
  enum { N = 12 };
  const sl__ffn_desc *fd = &m->ld[0].ffn;
  size_t sf = sl__moe_scratch_floats(fd, D, N);
  float *scratch = sl_malloc(sizeof(float) * sf),
        *one = sl_malloc(sizeof(float) * sl__moe_scratch_floats(fd, D, 1));
  static float x[N * D], out[N * D], alone[D];
  for (int i = 0; i < N * D; i++)
    x[i] = frand();
  double sum_rel = 0;
  for (int l = 0; l < NL; l++) {
    const sl__layer_w *w = &m->layers[l];
    CHECK_OK(sl__moe_ffn(pool, &m->ld[l].ffn, D, w, x, out, N, scratch));
    for (int t = 0; t < N; t++) {
      double ref[D], num = 0, den = 0;
      ref_ffn(m, l, x + t * D, ref);
      for (int i = 0; i < D; i++) {
        double e = out[t * D + i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
      }
      /* the products quantize their activations (Q8_0 for the gate and
       * up experts, Q8_K for the Q4_K down experts, whose inputs, products
       * of two normals, are heavy-tailed): 0.5% to 4% here at every
       * level. A wrong slice, a skipped renormalisation or a lost expert
       * errs by 30% or more. */
      double rel = sqrt(num / den);
      sum_rel += rel;
      CHECK_MSG(rel < 0.08, "%s layer %d token %d: rel %g",
                sl_kern_isa_name(isa), l, t, rel);
      CHECK_OK(
          sl__moe_ffn(pool, &m->ld[l].ffn, D, w, x + t * D, alone, 1, one));
      CHECK_MSG(memcmp(alone, out + t * D, sizeof alone) == 0,
                "%s layer %d token %d: alone differs from among %d",
                sl_kern_isa_name(isa), l, t, N);
    }
  }
  CHECK_MSG(sum_rel / (NL * N) < 0.025, "%s: mean rel %g",
            sl_kern_isa_name(isa), sum_rel / (NL * N));
  /* the load fused each expert's gate and up (Q8_0, FF rows: whole packing
   * groups) where this ISA packs Q8_0, and the fused product gives the
   * same bits as the two products */
  sl_kern_weight q8 = {SL_GGML_Q8_0, FF, D, x, NULL};
  bool packs = sl_kern_repack_bytes(&q8) > 0;
  for (int l = 0; l < NL; l++) {
    sl__layer_w w = m->layers[l];
    CHECK_MSG((w.gu_exps != NULL) == packs, "%s layer %d: fused %d, packs %d",
              sl_kern_isa_name(isa), l, w.gu_exps != NULL, packs);
    if (!w.gu_exps)
      continue;
    CHECK(sl_kern_packed_in_use(&w.gu_exps[0]));
    CHECK(w.gu_exps[0].rows == 2 * FF && w.gu_exps[0].data == NULL);
    CHECK(w.gate_exps[3].packed == w.gu_exps[3].packed);
    CHECK_OK(sl__moe_ffn(pool, &m->ld[l].ffn, D, &w, x, out, N, scratch));
    static float apart[N * D];
    w.gu_exps = NULL;
    CHECK_OK(sl__moe_ffn(pool, &m->ld[l].ffn, D, &w, x, apart, N, scratch));
    CHECK_MSG(memcmp(out, apart, sizeof apart) == 0,
              "%s layer %d: the fused gate/up differs from the two products",
              sl_kern_isa_name(isa), l);
  }
  sl_free(one);
  sl_free(scratch);
  sl_kern_pool_destroy(pool);
  sl_model_free(m);
}

/* ---- a sequence alone and in a batch of 16 ---- */

enum { NSEQ = 16, BPS = 8, BT = 16, STEPS = 4 }; /* 128 positions each */

typedef struct seqrun {
  int32_t prompt[40];
  int len;
  int32_t next; /* the token fed at the next decode step */
} seqrun;

/* Runs the sequences [0, ns) together: one prefill batch, then STEPS
 * decode steps; logits[s][step] (NV floats) of each. */
static void run_seqs(sl_batch_ctx_t *bc, const int32_t *tables, seqrun *sr,
                     int ns, float (*logits)[STEPS + 1][NV]) {
  sl_batch_seq seqs[NSEQ];
  int32_t toks[NSEQ * 40];
  static float lg[NSEQ * NV];
  for (int step = 0; step <= STEPS; step++) {
    int nt = 0;
    for (int s = 0; s < ns; s++) {
      int k = step ? 1 : sr[s].len, pos0 = step ? sr[s].len + step - 1 : 0;
      seqs[s] = (sl_batch_seq){
          tables + s * BPS, BPS,  pos0, nt, k, true, false, false,
          step > 0,         NULL, false};
      if (step)
        toks[nt] = sr[s].next;
      else
        memcpy(toks + nt, sr[s].prompt, sizeof(int32_t) * (size_t)k);
      nt += k;
    }
    sl_batch b = {toks, nt, seqs, ns};
    CHECK_OK(sl_batch_ctx_run(bc, &b, lg));
    for (int s = 0; s < ns; s++) {
      memcpy(logits[s][step], lg + s * NV, sizeof(float) * NV);
      int32_t best = 0;
      for (int v = 1; v < NV; v++)
        if (lg[s * NV + v] > lg[s * NV + best])
          best = v;
      sr[s].next = best;
    }
  }
}

static void test_alone_equals_batch(sl_kern_isa isa) {
  sl_model_t *m = load();
  if (!m)
    return;
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  sl_stream_t *s = sl_thread_stream(sl_cpu_device());
  sl_kv_view kv = {NULL, NL, NSEQ * BPS, BT, (int)(hp->n_head_kv * HD)};
  CHECK_OK(sl_buf_alloc(s, sl_kv_view_bytes(&kv), &kv.buf));
  sl_batch_ctx_t *bc = NULL;
  CHECK_OK(sl_batch_ctx_create(m, &kv, s, 2, &bc));
  static int32_t tables[NSEQ * BPS];
  for (int i = 0; i < NSEQ * BPS; i++)
    tables[i] = i;
  static seqrun sr[NSEQ], one;
  static float together[NSEQ][STEPS + 1][NV], alone[1][STEPS + 1][NV];
  for (int i = 0; i < NSEQ; i++) {
    sr[i].len = 1 + (int)(rw_rnd() % 40);
    for (int k = 0; k < sr[i].len; k++)
      sr[i].prompt[k] = (int32_t)(rw_rnd() % NV);
  }
  if (bc) {
    run_seqs(bc, tables, sr, NSEQ, together);
    for (int i = 0; i < NSEQ; i += 5) { /* 0, 5, 10, 15: each alone */
      one = sr[i];
      run_seqs(bc, tables, &one, 1, alone);
      for (int step = 0; step <= STEPS; step++)
        CHECK_MSG(memcmp(alone[0][step], together[i][step],
                         sizeof alone[0][step]) == 0,
                  "%s: sequence %d step %d differs in a batch of %d",
                  sl_kern_isa_name(isa), i, step, NSEQ);
    }
  }
  sl_batch_ctx_free(bc);
  sl_buf_release(kv.buf);
  sl_sync_and_clear_cache(s);
  sl_model_free(m);
}

int main(void) {
  sl_kern_isa isas[SL_KERN_ISA_COUNT];
  int nisa, rc = sl_test_isa_levels(isas, &nisa);
  if (rc >= 0)
    return rc;
  snprintf(g_path, sizeof g_path, "/tmp/sl_test_moe_%d.gguf", (int)getpid());
  write_model(g_path);
  RUN(test_route_order_and_weights);
  RUN(test_layer_desc);
  for (int k = 0; k < nisa; k++) {
    CHECK_OK(sl_kern_cpu_set_isa(isas[k]));
    fprintf(stderr, "   isa %s\n", sl_kern_isa_name(isas[k]));
    sl_test_current = "test_grouped_products";
    test_grouped_products(isas[k]);
    sl_test_current = "test_alone_equals_batch";
    test_alone_equals_batch(isas[k]);
  }
  unlink(g_path);
  sl_clear_thread_streams();
  sl_rt_shutdown();
  return sl_test_finish();
}
