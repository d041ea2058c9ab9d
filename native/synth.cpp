// Synthetic models at any scale. The tensor list comes from upstream's loader: it reads the metadata alone and,
// with no_alloc, creates every tensor the architecture asks for without allocating a byte of weights. The writer
// streams a GGUF: the metadata (gguf_get_meta_data), then each tensor's random values generated and converted to
// its type (ggml_quantize_chunk) chunk by chunk on a pool of threads, written in order, so memory stays at a few
// chunks per thread whatever the model size.
//
// Values are a function of (seed, tensor name, element index) alone: a counter-based generator, so the bytes do
// not depend on how the rows are split among threads. A "draft model" adds a second noise of its own seed.
#include "shim_common.h"

#include "gguf.h"
#include "llama-model.h"  // llama_internal_get_tensor_map

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

uint64_t hash_name(const char * s) {  // FNV-1a: stable across runs and platforms, unlike std::hash
    uint64_t h = 1469598103934665603ull;
    for (; *s; ++s) {
        h = (h ^ (uint8_t) *s) * 1099511628211ull;
    }
    return h;
}

inline uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

constexpr uint64_t GOLDEN = 0x9e3779b97f4a7c15ull;

// unit-variance noise at element i of the stream `key`: the sum of four 16-bit uniforms of one 64-bit draw
// (Irwin-Hall, bell-shaped, bounded at +-3.46), standardized; cheap enough to fill billions of weights
inline float noise(uint64_t key, uint64_t i) {
    const uint64_t r = mix64(key + (i + 1) * GOLDEN);
    const uint32_t s = (uint32_t) (r & 0xffff) + (uint32_t) ((r >> 16) & 0xffff) + (uint32_t) ((r >> 32) & 0xffff) +
                       (uint32_t) (r >> 48);
    return ((float) s - 131070.0f) * (1.0f / 37837.23f);  // mean 4*65535/2, sd sqrt(4*(65536^2-1)/12)
}

struct tensor_job {
    std::string name;
    int64_t ne[4];
    ggml_type type;
    int32_t kind;
    uint64_t key;         // stream of the values
    uint64_t perturb_key; // stream of the second noise
    size_t row_bytes;
};

struct chunk {
    size_t tensor;
    int64_t row0;
    int64_t nrows;
};

bool supported_type(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32:
        case GGML_TYPE_F16:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

void fill_rows(const tensor_job & t, const pls_synth_params & p, int64_t row0, int64_t nrows, std::vector<float> & f32,
               std::vector<uint8_t> & out) {
    const int64_t n_per_row = t.ne[0];
    const int64_t n = nrows * n_per_row;
    f32.resize((size_t) n);
    const uint64_t base = (uint64_t) row0 * (uint64_t) n_per_row;
    const float sd = p.stddev;
    switch (t.kind) {
        case PLS_SYNTH_NORM:
            for (int64_t i = 0; i < n; ++i) {
                f32[i] = 1.0f + sd * noise(t.key, base + i);
            }
            break;
        case PLS_SYNTH_NEGATIVE:
            for (int64_t i = 0; i < n; ++i) {
                f32[i] = -std::fabs(sd * noise(t.key, base + i));
            }
            break;
        default:
            for (int64_t i = 0; i < n; ++i) {
                f32[i] = sd * noise(t.key, base + i);
            }
    }
    if (p.perturb_seed != 0) {
        const float psd = p.perturb_stddev;
        for (int64_t i = 0; i < n; ++i) {
            f32[i] += psd * noise(t.perturb_key, base + i);
        }
    }
    out.resize((size_t) nrows * t.row_bytes);
    const size_t written = ggml_quantize_chunk(t.type, f32.data(), out.data(), 0, nrows, n_per_row, nullptr);
    if (written != out.size()) {
        throw std::runtime_error("synthetic tensor " + t.name + ": converted to " + std::to_string(written) +
                                 " bytes, expected " + std::to_string(out.size()));
    }
}

struct file_closer {
    void operator()(FILE * f) const { if (f) fclose(f); }
};

std::string errno_text() {
    return std::strerror(errno);
}

}  // namespace

extern "C" int32_t pls_synth_list_tensors(const char * meta_path, int32_t load_mtp, char * buf, int32_t buf_size,
                                          char * err, size_t err_size) {
    pls::ensure_init();
    if (meta_path == nullptr) {
        pls::set_err(err, err_size, "synthetic model: a metadata GGUF is required");
        return -1;
    }
    gguf_init_params gp = { /* .no_alloc = */ true, /* .ctx = */ nullptr };
    std::unique_ptr<gguf_context, void (*)(gguf_context *)> g(gguf_init_from_file(meta_path, gp), gguf_free);
    if (!g) {
        pls::set_err(err, err_size, std::string("synthetic model: cannot read the metadata GGUF ") + meta_path);
        return -1;
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.no_alloc = true;       // shapes only: no weight buffer, no set_tensor_data calls
    mp.load_mtp = load_mtp != 0;
    pls::clear_last_error();
    llama_model * m = nullptr;
    try {
        m = llama_model_init_from_user(g.get(), [](ggml_tensor *, void *) {}, nullptr, mp);
    } catch (const std::exception & e) {
        pls::set_err(err, err_size, std::string("synthetic model: ") + e.what());
        return -1;
    }
    if (m == nullptr) {
        pls::set_err(err, err_size, "synthetic model: upstream refused the metadata: " + pls::take_last_error());
        return -1;
    }
    std::string json = "[";
    std::set<std::string> seen;  // duplicated tensors (shared rope factors, tied heads) appear once
    for (const auto & [name, t] : llama_internal_get_tensor_map(m)) {
        if (!seen.insert(name).second) {
            continue;
        }
        if (json.size() > 1) {
            json += ",";
        }
        json += "{\"name\":\"" + name + "\",\"ne\":[";
        for (int d = 0; d < GGML_MAX_DIMS; ++d) {
            json += (d ? "," : "") + std::to_string(t->ne[d]);
        }
        json += "]}";
    }
    json += "]";
    llama_model_free(m);
    return pls::copy_out(json, buf, buf_size);
}

namespace {

// A refusal or failure of pls_synth_write: its message (after "synthetic model: ") and status.
struct synth_error {
    std::string what;
    int32_t rc = -1;
};

[[noreturn]] void refuse(const std::string & what) { throw synth_error{ what, -1 }; }

using gguf_ptr = std::unique_ptr<gguf_context, void (*)(gguf_context *)>;
using ggml_ptr = std::unique_ptr<ggml_context, void (*)(ggml_context *)>;

void check_params(const char * meta_path, const pls_synth_tensor * tensors, int32_t n_tensors,
                  const pls_synth_params * params, const char * path_out) {
    if (meta_path == nullptr || path_out == nullptr || params == nullptr || (tensors == nullptr && n_tensors > 0) ||
        n_tensors < 0) {
        refuse("metadata, tensors, parameters and an output path are required");
    }
    const pls_synth_params & p = *params;
    if (!std::isfinite(p.stddev) || p.stddev <= 0.0f || (p.perturb_seed != 0 && (!std::isfinite(p.perturb_stddev) ||
                                                                                   p.perturb_stddev <= 0.0f))) {
        refuse("stddev (and perturb_stddev with a perturb seed) must be finite and > 0");
    }
}

// the metadata GGUF, which must hold no tensors yet
gguf_ptr open_metadata(const char * meta_path) {
    gguf_init_params gp = { /* .no_alloc = */ true, /* .ctx = */ nullptr };
    gguf_ptr g(gguf_init_from_file(meta_path, gp), gguf_free);
    if (!g) {
        refuse(std::string("cannot read the metadata GGUF ") + meta_path);
    }
    if (gguf_get_n_tensors(g.get()) != 0) {
        refuse("the metadata GGUF must hold no tensors");
    }
    return g;
}

// One tensor checked and added to the GGUF (its descriptor in ctx), with the keys of its value streams.
tensor_job describe_tensor(const pls_synth_tensor & src, int32_t i, gguf_context * g, ggml_context * ctx,
                           uint64_t seed_key, uint64_t perturb_key) {
    tensor_job t;
    if (src.name == nullptr || src.name[0] == '\0' || strlen(src.name) >= GGML_MAX_NAME) {
        refuse("tensor " + std::to_string(i) + " has no name or one of " + std::to_string(GGML_MAX_NAME) +
               "+ characters");
    }
    t.name = src.name;
    t.type = (ggml_type) src.type;
    t.kind = src.kind;
    if (src.type < 0 || src.type >= GGML_TYPE_COUNT || !supported_type(t.type)) {
        refuse("tensor " + t.name + " has type " + std::to_string(src.type) + "; supported: F32, F16, Q8_0, Q4_0, Q6_K");
    }
    for (int d = 0; d < 4; ++d) {
        t.ne[d] = src.ne[d];
        if (t.ne[d] < 1) {
            refuse("tensor " + t.name + " has a dimension < 1");
        }
    }
    if (t.ne[0] % ggml_blck_size(t.type) != 0) {
        refuse("tensor " + t.name + " has rows of " + std::to_string(t.ne[0]) + ", not a multiple of " +
               ggml_type_name(t.type) + "'s block of " + std::to_string(ggml_blck_size(t.type)));
    }
    if (gguf_find_tensor(g, t.name.c_str()) >= 0) {
        refuse("tensor " + t.name + " is listed twice");
    }
    ggml_tensor * gt = ggml_new_tensor(ctx, t.type, 4, t.ne);
    ggml_set_name(gt, t.name.c_str());
    gguf_add_tensor(g, gt);
    t.row_bytes = ggml_row_size(t.type, t.ne[0]);
    const uint64_t h = hash_name(src.name);
    t.key = mix64(seed_key ^ h);
    t.perturb_key = mix64(perturb_key ^ h ^ 0xd1b54a32d192ed03ull);
    ggml_quantize_init(t.type);  // up front: its lazy init is not for concurrent first calls
    return t;
}

std::vector<tensor_job> describe_tensors(const pls_synth_tensor * tensors, int32_t n_tensors, const pls_synth_params & p,
                                         gguf_context * g, ggml_context * ctx) {
    std::vector<tensor_job> jobs;
    jobs.reserve((size_t) n_tensors);
    const uint64_t seed_key = mix64(((uint64_t) p.seed << 1) ^ 0x5eedull);
    const uint64_t perturb_key = mix64(((uint64_t) p.perturb_seed << 1) ^ 0x9e27ull);
    for (int32_t i = 0; i < n_tensors; ++i) {
        jobs.push_back(describe_tensor(tensors[i], i, g, ctx, seed_key, perturb_key));
    }
    return jobs;
}

// chunks of whole rows, about 1M values each, in file order; total_bytes: the tensors' data without padding
std::vector<chunk> plan_chunks(const std::vector<tensor_job> & jobs, uint64_t & total_bytes) {
    std::vector<chunk> chunks;
    total_bytes = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
        const tensor_job & t = jobs[i];
        const int64_t nrows = t.ne[1] * t.ne[2] * t.ne[3];
        const int64_t per = std::max<int64_t>(1, (int64_t{1} << 20) / t.ne[0]);
        for (int64_t r = 0; r < nrows; r += per) {
            chunks.push_back({ i, r, std::min(per, nrows - r) });
        }
        total_bytes += (uint64_t) nrows * t.row_bytes;
    }
    return chunks;
}

// the output file, buffered through iobuf, with the GGUF's metadata written
std::unique_ptr<FILE, file_closer> write_metadata(const char * path_out, gguf_context * g, std::vector<char> & iobuf) {
    std::unique_ptr<FILE, file_closer> f(fopen(path_out, "wb"));
    if (!f) {
        refuse(std::string("cannot open ") + path_out + ": " + errno_text());
    }
    setvbuf(f.get(), iobuf.data(), _IOFBF, iobuf.size());
    std::vector<uint8_t> meta(gguf_get_meta_size(g));
    gguf_get_meta_data(g, meta.data());
    if (fwrite(meta.data(), 1, meta.size(), f.get()) != meta.size()) {
        refuse(std::string("cannot write ") + path_out + ": " + errno_text());
    }
    return f;
}

const uint8_t zeros[64] = { 0 };

// zeros up to position `to` of the data section (false if the file refused them)
bool pad_to(FILE * f, uint64_t & pos, uint64_t to) {
    while (pos < to) {
        const size_t n = (size_t) std::min<uint64_t>(sizeof(zeros), to - pos);
        if (fwrite(zeros, 1, n, f) != n) {
            return false;
        }
        pos += n;
    }
    return true;
}

// The tensors' data: worker threads fill chunks (a window of them ahead of the writer), the calling thread writes
// them in file order, padding each tensor to the GGUF alignment, and reports progress (which may cancel).
class data_writer {
public:
    data_writer(const std::vector<tensor_job> & jobs, const std::vector<chunk> & chunks, const pls_synth_params & p,
                gguf_context * g, FILE * f, const char * path_out)
        : jobs(jobs), chunks(chunks), p(p), g(g), f(f), path_out(path_out), done(chunks.size(), 0) {
        n_threads = p.n_threads > 0 ? p.n_threads : (int) std::max(1u, std::thread::hardware_concurrency());
        n_threads = std::max(1, std::min<int>(n_threads, (int) std::max<size_t>(1, chunks.size())));
        window = (size_t) std::max(8, 3 * n_threads);  // chunks in flight or waiting to be written
        slots.resize(window);
    }

    // writes the data section; the position reached (within the data section) in pos
    void run(uint64_t total_bytes, pls_synth_progress_cb progress, void * user_data, uint64_t & pos) {
        std::vector<std::thread> pool;
        pool.reserve((size_t) n_threads);
        for (int i = 0; i < n_threads; ++i) {
            pool.emplace_back([this] { work(); });
        }
        const int32_t rc = write_in_order(total_bytes, progress, user_data, pos);
        {
            std::lock_guard<std::mutex> lk(mu);
            stop = true;
            cv.notify_all();
        }
        for (auto & th : pool) {
            th.join();
        }
        if (!failure.empty()) {
            throw synth_error{ failure, rc != 0 ? rc : -1 };
        }
    }

private:
    const std::vector<tensor_job> & jobs;
    const std::vector<chunk> & chunks;
    const pls_synth_params & p;
    gguf_context * g;
    FILE * f;
    const char * path_out;
    int n_threads = 1;
    size_t window = 8;
    std::vector<std::vector<uint8_t>> slots;
    std::vector<char> done;
    std::mutex mu;
    std::condition_variable cv;
    size_t next = 0, written = 0;
    bool stop = false;
    std::string failure;

    void work() {
        std::vector<float> f32;
        for (;;) {
            size_t j;
            {
                std::unique_lock<std::mutex> lk(mu);
                cv.wait(lk, [&] { return stop || next >= chunks.size() || next < written + window; });
                if (stop || next >= chunks.size()) {
                    return;
                }
                j = next++;
            }
            std::vector<uint8_t> out;
            {
                std::lock_guard<std::mutex> lk(mu);
                out.swap(slots[j % window]);  // reuse the slot's allocation
            }
            try {
                fill_rows(jobs[chunks[j].tensor], p, chunks[j].row0, chunks[j].nrows, f32, out);
            } catch (const std::exception & e) {
                std::lock_guard<std::mutex> lk(mu);
                if (failure.empty()) {
                    failure = e.what();
                }
                stop = true;
                cv.notify_all();
                return;
            }
            std::lock_guard<std::mutex> lk(mu);
            slots[j % window].swap(out);
            done[j] = 1;
            cv.notify_all();
        }
    }

    int32_t write_in_order(uint64_t total_bytes, pls_synth_progress_cb progress, void * user_data, uint64_t & pos) {
        uint64_t data_done = 0;
        int32_t rc = 0;
        for (size_t j = 0; j < chunks.size(); ++j) {
            std::vector<uint8_t> out;
            {
                std::unique_lock<std::mutex> lk(mu);
                cv.wait(lk, [&] { return stop || done[j]; });
                if (!done[j]) {
                    break;
                }
                out.swap(slots[j % window]);
            }
            const chunk & c = chunks[j];
            const uint64_t offset = gguf_get_tensor_offset(g, (int64_t) c.tensor);
            if (c.row0 == 0) {
                pad_to(f, pos, offset);
            }
            const bool ok = pos == offset + (uint64_t) c.row0 * jobs[c.tensor].row_bytes &&
                            fwrite(out.data(), 1, out.size(), f) == out.size();
            pos += out.size();
            data_done += out.size();
            const bool cancel = ok && progress != nullptr && progress(user_data, data_done, total_bytes) != 0;
            std::lock_guard<std::mutex> lk(mu);
            slots[j % window].swap(out);
            written = j + 1;
            if (!ok || cancel) {
                if (failure.empty()) {
                    failure = !ok ? std::string("cannot write ") + path_out + ": " + errno_text() : "cancelled";
                }
                rc = cancel ? -2 : -1;
                stop = true;
            }
            cv.notify_all();
            if (stop) {
                break;
            }
        }
        return rc;
    }
};

}  // namespace

// A synthetic GGUF: the metadata GGUF's keys, then every tensor filled with seeded noise (see fill_rows), written
// in file order while worker threads fill the chunks ahead of the writer.
extern "C" int32_t pls_synth_write(const char * meta_path, const pls_synth_tensor * tensors, int32_t n_tensors,
                                   const pls_synth_params * params, const char * path_out,
                                   pls_synth_progress_cb progress, void * user_data, char * err, size_t err_size) {
    pls::ensure_init();
    try {
        check_params(meta_path, tensors, n_tensors, params, path_out);
        const pls_synth_params p = *params;
        gguf_ptr g = open_metadata(meta_path);
        // tensor infos: a no_alloc ggml context holds the descriptors gguf needs for offsets and sizes
        ggml_init_params ip = { ggml_tensor_overhead() * (size_t) (n_tensors + 1), nullptr, /* .no_alloc = */ true };
        ggml_ptr ctx(ggml_init(ip), ggml_free);
        const std::vector<tensor_job> jobs = describe_tensors(tensors, n_tensors, p, g.get(), ctx.get());
        uint64_t total_bytes = 0;
        const std::vector<chunk> chunks = plan_chunks(jobs, total_bytes);
        std::vector<char> iobuf(8 << 20);
        std::unique_ptr<FILE, file_closer> f = write_metadata(path_out, g.get(), iobuf);
        uint64_t pos = 0;  // position within the data section
        data_writer(jobs, chunks, p, g.get(), f.get(), path_out).run(total_bytes, progress, user_data, pos);
        // the data section ends padded, as gguf's own writer leaves it
        const size_t align = gguf_get_alignment(g.get());
        pad_to(f.get(), pos, (pos + align - 1) / align * align);
        if (fflush(f.get()) != 0 || ferror(f.get())) {
            refuse(std::string("cannot write ") + path_out + ": " + errno_text());
        }
        return 0;
    } catch (const synth_error & e) {
        pls::set_err(err, err_size, "synthetic model: " + e.what);
        return e.rc;
    }
}
