// The draft-length controller (adaptive.h): cost tables learnt from measured steps, acceptance hazards, and the
// choice of each step's draft lengths - choose() and observe() in named steps, then the probes and the ledger.
#include "adaptive.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

namespace pls {

namespace {

constexpr double EMA = 0.25;               // weight of a new cost observation
// per draft of a stream: ~100 drafts of memory. Shorter memories flip marginal streams off on a run of bad luck (at a
// true acceptance of 0.6 the estimate of ~33 drafts strays below break-even often), and on a GPU every flip pays cold
// batch shapes; a real change of content is caught sooner by the ledger and by probes than by the hazards
constexpr double HAZARD_DECAY = 0.99;
constexpr double POOL_DECAY = 0.99;
constexpr double PRIOR_HAZARD = 0.8;       // before anything is known: optimistic, so speculation gets tried
constexpr double PRIOR_WEIGHT = 2.0;
constexpr double POSITION_WEIGHT = 2.0;
constexpr double PROBE_BUDGET = 0.02;      // probes may cost this share of plain decoding
// and this share once SPARSE_AFTER probes in a row found drafting not even plausible (a standard error's hope), landed
// tokens or not: where drafting does not pay, probing was most of what a stream off lost to plain decoding (H100,
// natural acceptance: 1.3-1.6% of plain's time beside the attached drafter's 0.2-1%; at p 0.3, where a probe's run
// lands a token most times, 3.0% - the probes' first steps and their runs - on the 27B + DFlash2). A token that lands
// after them brings the next probe at once, so a content that drafts again is not left waiting for the longer intervals
constexpr double SPARSE_BUDGET = 0.01;
constexpr int32_t SPARSE_AFTER = 4;
constexpr int32_t PROBE_K = 1;
constexpr int32_t GAP_MIN = 4;
constexpr int32_t GAP_MAX = 4096;
constexpr int32_t LEDGER_STEPS = 48;       // speculative steps judged together
constexpr double LEDGER_SLACK = 0.02;      // plus the acceptance noise of the window (LEDGER_Z / sqrt(tokens))
constexpr double LEDGER_Z = 2.0;          // standard errors of a window's acceptance luck allowed (checked every step)
constexpr int32_t PLAIN_REFRESH = 128;     // plain steps at least this often while speculating
constexpr int32_t STEADY_RUN = 3;          // a size's steady cost: its third run in a row (a GPU graph captured, replayed)
constexpr int32_t EXPLORE_ONE_IN = 32;     // try one more position now and then
constexpr double PROBE_HOPE = 1.0;         // standard errors of acceptance a dear probe's schedule hopes for
constexpr double EXPLORE_DEAR = 8.0;       // where changing the batch size is dear, rarer by this per cold-to-plain ratio
constexpr double BEST_CASE_MARGIN = 1.1;   // drafting "could pay" when every token landing beats plain by this
constexpr double CATCHUP_PLAIN_STEPS = 8.0;  // one catch-up of a draft model costs at most about this many plain steps
constexpr int32_t STEADY_FIRST = 4;        // a draft model's first decode right after a draft: 1 + what it caught up
constexpr int32_t OWED_RUN_MAX = 4;        // probes in a row to price drafting, at most
constexpr double PROBE_PAYS_MARGIN = 1.02; // a probe turns drafting on where it would gain more than this
constexpr int32_t NEW_PROMPT_GAP_MAX = 32; // first probe interval of a new prompt, at most
constexpr double PROBE_EXCESS_RATE = 0.25; // a probe's measured cost follows the latest probes at this rate
constexpr double PROBE_CREDIT_MAX = 2.0;   // a stream off saves up for this many probes at most
constexpr int32_t ISO_WEIGHT_MAX = 16;     // a size's runs weigh this much at most in the monotone fit of a cost table
constexpr double PROBE_LANDED_DECAY = 0.7; // evidence kept when a probe lands (one token says little on its own)
// where a probe's cost is mostly its first step (a GPU's first runs of its batch in a KV window, the catch-up of a
// drafter that reads every target batch), the probe goes on for up to this many steps in a row while drafting would
// pay at an acceptance PROBE_RUN_HOPE standard errors better: each further step costs a steady draft's excess and adds
// a draft's evidence. A probe of one token, widely spaced, left the 35B-A3B at p 0.6 off for whole sessions after a
// few rejections in a row (5 of 40 sessions replayed on an H100's costs, from a cost cache; on the GPU, 0.90 of n3)
constexpr int32_t PROBE_RUN = 6;
constexpr double PROBE_RUN_HOPE = 2.0;
// a stream turned on by a probe is expected to draft this long, at least (at 8, a GPU's switch cost kept probes that
// landed every token at p 0.6 from turning drafting on: replayed on the 35B-A3B's trace, 10 of 24 sessions trapped)
constexpr int32_t SWITCH_STEPS = 24;
constexpr double SWITCH_WEIGHT = 2.0;      // a change of batch size costs its cold runs: on a GPU an eager one, then a capture
// a change between draft lengths is priced over this many steps, which a length chosen holds at the least (replayed
// on the H200's traces, 8 or 24 left the 35B-A3B drafting 4 where 7 paid in answers of 64 tokens)
constexpr double SWITCH_SPREAD = 4.0;
constexpr double COLD_DEAR = 0.1;          // changes count where a cold run costs this share of a plain step (not a CPU's)
constexpr double STALL_STEP = 0.125;      // the most one dear run raises a learnt cost by (a share of it)
// a size measured in this many steady runs is priced at most RECENT_SLACK over the mean of the middle half of its
// latest RECENT_RUNS: a GPU's runs go dear a few steps at a time (a size's verify 2-8% and its DFlash2 call 40-75%
// dearer for five steps in a row, the 27B at 4 096 on an H100), which the moving average took in - the length was
// left priced 7% too dear, and never run in a row again to bring its price back (0.95 of n3). (Priced by that mean
// alone, costs drawn independently - the replay's - fared as well on the whole, but the 27B's H200 trace at p 0.8
// drafted 6 on a tenth of one seed's steps where 5 was best: the mean of a skewed cost's middle runs is below its mean)
constexpr size_t RECENT_MIN = 8;
constexpr size_t RECENT_RUNS = 16;
constexpr double RECENT_SLACK = 0.01;
constexpr double IN_LINE = 1.25;          // a size's one run is in line with the line through shorter sizes within this
constexpr double COLD_MAX = 4.0;          // a one-off run's extra beyond this many steady runs of its size is a stall
// a lone stream's whole step by its draft length: a mean over this many steps at most (a step's cost spreads +-13% on the
// H200 with its acceptance), judged by once measured this often, and tried (where a batch's first runs are cold) in runs
// this long - a try's cost on a GPU is its two changes of batch size, not its length
constexpr int32_t WHOLE_MEMORY = 32;
constexpr int32_t WHOLE_MIN = 6;
constexpr int32_t EXPLORE_RUN = 12;
constexpr int32_t EXPLORE_RUN_PARTS = STEADY_RUN + 2;  // a feature-reading drafter's try: steady runs of its parts
constexpr int32_t OWN_RUNS = EXPLORE_RUN_PARTS - 1;  // a pooled cost table's size priced by its own runs from this many
constexpr double THIN_TRIALS = 1.0;       // a position judged fewer times than this (decayed) is tried where close
constexpr double EXPLORE_CLOSE = 0.95;    // a longer length is tried in a run where its rate by the parts is this close
constexpr double HOLD_MARGIN = 0.03;      // a lone stream leaves its draft length for one priced better by this
// or for one that leads it step after step by less (switch_lead): what it would have saved, less HOLD_DRIFT of each
// step, summed until it pays the change in full and at least HOLD_EVIDENCE of a step (a lead of 2.5% within ten
// steps, of 2% within twenty, of 1.5% or less never: lengths that price alike are not traded for noise). A change
// priced over a few steps needs a lead no length has over its neighbour, so a prompt's first choice was kept for the
// whole answer where another was 5-9% better a token by then (the 27B + DFlash2 at 16 384, H200 costs replayed after
// acceptance rose from 0.6 to 0.8: 3 held on 28% of the next four answers' steps, 0.95 of n5)
constexpr double HOLD_DRIFT = 0.015;
constexpr double HOLD_EVIDENCE = 0.10;
constexpr int32_t KEPT_GRAPHS = 8;        // a context keeps a graph per batch shape in this many slots (patch 0010):
                                          // a lone stream's batches of n and n + 8 tokens share one

}  // namespace

bool valid_kv_window(int32_t cells) {
    return cells >= 256 && cells <= 65536 && (cells & (cells - 1)) == 0;
}

// ---- cost_table --------------------------------------------------------------------------------

int cost_table::bucket_of(int32_t depth) {
    int b = 0;
    for (int32_t d = 512; depth >= d && b < N_BUCKETS - 1; d *= 2) {
        ++b;
    }
    return b;
}

void cost_table::observe(int32_t n_tokens, int32_t bucket, double ms, bool steady, bool cold) {
    if (!(ms >= 0.0) || !std::isfinite(ms) || n_tokens < 1) {
        return;
    }
    n_tokens = std::min(n_tokens, MAX_T);
    bucket = std::clamp(bucket, 0, N_BUCKETS - 1);
    bucket_data & b = b_[bucket];
    const auto it = std::lower_bound(b.keys.begin(), b.keys.end(), n_tokens);
    const size_t i = it - b.keys.begin();
    if (it == b.keys.end() || *it != n_tokens) {
        // a batch size's first runs may pay one-time costs (a GPU graph captured for the new shape, caches): until
        // a size has been seen twice, it counts for at most 1.5x what the sizes seen twice predict, so one spike
        // cannot make every larger batch look dear (and keep speculation off, never to measure it again)
        double ref = predict_confirmed(b, n_tokens);
        if (!(ref > 0.0) && has_any()) {
            ref = predict(n_tokens, bucket);  // nothing seen twice here yet: the sizes seen once, a neighbour's curve
        }
        bool capped = false;
        if (ref > 0.0 && ms > 1.5 * ref) {
            ms = 1.5 * ref;
            capped = true;
        }
        b.keys.insert(it, n_tokens);
        b.ms.insert(b.ms.begin() + i, ms);
        b.count.insert(b.count.begin() + i, 1);
        b.capped.insert(b.capped.begin() + i, capped ? 1 : 0);
        b.steady.insert(b.steady.begin() + i, steady ? 1 : 0);
        b.stale.insert(b.stale.begin() + i, 0);
        b.dear.insert(b.dear.begin() + i, 0);
        b.recent.insert(b.recent.begin() + i, steady ? std::vector<float>{ (float) ms } : std::vector<float>{});
    } else if (b.steady[i] && !steady) {
        // measured in steady runs: a one-off run's extra cost is not this size's. But a one-off run costs at least
        // what a steady one does, so one cheaper than a price that fewer than STEADY_RUN runs set says the price is too
        // high: it may rest on runs steady in name only - a session's first calls of a block of 4 (7.0 and 4.7 ms,
        // the second and third of its first runs in a KV window, before such runs were known to be dear) priced it at
        // 4.7 where runs cost 3.98, and its single tries (3.9) never moved it: the 27B + DFlash2 on an H100 drafted 2
        // through whole answers at p 0.6 where 3 was 3% faster a token. It moves towards that run. (For a size with
        // more runs, no: a block drafter's call varies with what the step before accepted - 3.6-4.5 ms at one length
        // - and its cheap one-off calls priced a length under its neighbour's, 6 under 7 at p 0.9)
        if (ms < b.ms[i] && b.recent[i].size() < (size_t) STEADY_RUN) {
            b.ms[i] += EMA * (ms - b.ms[i]);
            rebuild(b);
        }
        return;
    } else if (!b.steady[i] && steady) {
        // the first steady run replaces what one-off runs (or another session) said where it is cheaper - else a
        // single stalled run would set the cost (a plain step priced dear keeps a run drafting until the next
        // refresh); a capped value was a guess, replaced whatever it is
        b.ms[i] = b.capped[i] ? ms : std::min(b.ms[i], ms);
        b.count[i]++;
        b.capped[i] = 0;
        b.steady[i] = 1;
        b.stale[i] = 0;
        b.recent[i].assign(1, (float) ms);
    } else if (b.stale[i] && steady) {
        // another session's cost (another time, another load on the machine): this session's first steady run says
        // what the size costs now - a dearer run by at most a stall's step, so one stalled run does not set it
        double & cell = b.ms[i];
        cell = std::min(ms, cell * (1.0 + STALL_STEP));
        b.count[i]++;
        b.stale[i] = 0;
        b.recent[i].assign(1, (float) ms);
    } else {
        // a single stall (page fault, another process) must not throw the estimate; a real shift wins in a few steps
        double & cell = b.ms[i];
        std::vector<float> & recent = b.recent[i];
        const bool run = b.steady[i] && steady && !cold;
        if (run) {
            recent.push_back((float) ms);
            if (recent.size() > RECENT_RUNS) {
                recent.erase(recent.begin());
            }
        }
        if (b.count[i]++ == 1) {
            // the second run of a size replaces a first run that paid a warm-up - or one that was capped (the
            // prediction it was capped by was a guess: this run says what the size really costs) - unless it ran
            // cold itself: then it only lowers the guess (a probe's batch of 2 right after one of 16, each its size's
            // first run after a prompt, cost the 35B-A3B + DFlash 26 ms on an H200 where a warm one costs 5: taken as
            // the size's cost, no draft length could pay, and the stream never drafted again)
            cell = b.capped[i] && !cold ? ms : std::min(cell, ms);
            b.capped[i] = cold ? b.capped[i] : 0;
        } else if (!cold) {
            // a stall is one-sided and one run long: a run over 2 STALL_STEP dearer than the size's cost counts (in a
            // table whose steady runs cost alike) once the size's next run is dear too, and then moves it by at most
            // STALL_STEP of itself. Counted at once, one stall raised the price of the length a stream drafted at by
            // 12% and the stream left it for another, so that no steady run of it was seen again to bring its price
            // back: the 27B + DFlash2 at 4 096 on an H100, p 0.6, one verify of 23.9 ms among runs of 14.4 - the stream
            // drafted 2 for the rest of its answers where 3 was 3-4% faster a token
            const bool dear = stall_confirmed && ms > cell * (1.0 + 2.0 * STALL_STEP);
            if (!dear || b.dear[i]) {
                const double x = std::clamp(ms, cell / 3.0, cell * (1.0 + STALL_STEP / EMA));
                cell += EMA * (x - cell);
            }
            b.dear[i] = dear ? 1 : 0;
        }
        if (run && recent.size() >= RECENT_MIN) {
            // at most a little over the mean of the middle half of its latest runs
            std::array<float, RECENT_RUNS> sorted;
            const auto end = std::copy(recent.begin(), recent.end(), sorted.begin());
            std::sort(sorted.begin(), end);
            const size_t cut = recent.size() / 4;
            const double mid = std::accumulate(sorted.begin() + cut, end - cut, 0.0) / (double) (recent.size() - 2 * cut);
            cell = std::min(cell, mid * (1.0 + RECENT_SLACK));
        }
    }
    b.n_seen++;
    rebuild(b);
}

// A size between two seen is priced on the line between them - but at most along the slope of the segment below
// the lower one. Costs need not rise evenly: a GPU's vector kernels stop at 8 rows, so on the 35B-A3B a batch of 9
// costs 14.6 ms on an H100 against 8.7 for 8. A line from a batch of 2 to one of 9 priced 8 at 13 ms, no length
// between was ever tried, and at p 0.9 the arm drafted 15 on 90% of its steps where 7 was 1.37x faster a token
// (0.73 of n7). Priced this way, a size under a cliff is tried once and then priced by its own runs; where costs do
// rise evenly the two prices agree.
static double cliff_bound(int32_t n_below, double ms_below, int32_t n_lo, double ms_lo, int32_t n) {
    const double slope = std::max(0.0, (ms_lo - ms_below) / (double) std::max(1, n_lo - n_below));
    return ms_lo + slope * (n - n_lo);
}

void cost_table::rebuild(bucket_data & b) const {
    // a size seen in one-off runs only is held to the line through the sizes measured in steady runs: what it costs
    // in a run of its own, not what its first runs after other sizes paid
    b.eff = b.ms;
    std::vector<size_t> st;
    for (size_t j = 0; j < b.keys.size(); ++j) {
        if (b.steady[j]) {
            st.push_back(j);
        }
    }
    if (!st.empty()) {
        // (one size measured steady: a smaller one costs at most what it does - the 27B's DFlash2 calls of 1-4 tokens,
        // drafted only after plain steps at 5.9-6.8 ms, pooled with its steady run at 5, priced it 0.6 ms dearer)
        const double slope = st.size() < 2 ? 0.0
                                           : (b.ms[st.back()] - b.ms[st.front()]) /
                                                 (double) (b.keys[st.back()] - b.keys[st.front()]);
        for (size_t j = 0; j < b.keys.size(); ++j) {
            if (b.steady[j]) {
                continue;
            }
            const int32_t n = b.keys[j];
            size_t hi = 0;
            while (hi < st.size() && b.keys[st[hi]] < n) {
                hi++;
            }
            double line;
            if (hi == st.size() && st.size() < 2) {
                if (!pooled) {
                    continue;  // above the one size measured steady: no line to hold it to
                }
                // a block drafter's call, above the one size measured steady: held to that size's cost per token,
                // which its cost (hardly growing with the size) stays under. Its first calls in a session say nothing
                // of it: the first 27B + DFlash2 session of a process called blocks of 3 and 6 for 34 and 78 ms once
                // (4-5 steady), and priced by them, with only the block of 2 measured in runs, the stream drafted 1
                // through whole answers where 3 was 15% faster a token
                line = b.ms[st.back()] * n / (double) b.keys[st.back()];
            } else if (hi == 0) {
                line = b.ms[st[0]] - slope * (b.keys[st[0]] - n);
            } else if (hi == st.size()) {
                line = b.ms[st.back()] + std::max(0.0, slope) * (n - b.keys[st.back()]);
            } else {
                const size_t lo = st[hi - 1], up = st[hi];
                line = b.ms[lo] + (b.ms[up] - b.ms[lo]) * (n - b.keys[lo]) / (double) (b.keys[up] - b.keys[lo]);
                if (hi >= 2) {
                    line = std::min(line, cliff_bound(b.keys[st[hi - 2]], b.ms[st[hi - 2]], b.keys[lo], b.ms[lo], n));
                }
            }
            b.eff[j] = std::min(b.ms[j], std::max(0.0, line));
        }
    }
    b.env.resize(b.eff.size());
    if (!pooled) {
        double run = 0.0;
        for (size_t j = 0; j < b.eff.size(); ++j) {
            run = std::max(run, b.eff[j]);
            b.env[j] = run;
        }
        return;
    }
    // adjacent sizes that disagree pooled, weighted by their runs (isotonic regression)
    struct pool {
        double sum, w;
        size_t n;
    };
    std::vector<pool> pools;
    for (size_t j = 0; j < b.eff.size(); ++j) {
        const double w = std::min<double>(std::max(b.count[j], 1), ISO_WEIGHT_MAX);
        pools.push_back({ b.eff[j] * w, w, 1 });
        while (pools.size() > 1 && pools[pools.size() - 2].sum / pools[pools.size() - 2].w > pools.back().sum / pools.back().w) {
            const pool last = pools.back();
            pools.pop_back();
            pools.back().sum += last.sum;
            pools.back().w += last.w;
            pools.back().n += last.n;
        }
    }
    size_t j = 0;
    for (const pool & q : pools) {
        for (size_t e = 0; e < q.n; ++e) {
            b.env[j++] = q.sum / q.w;
        }
    }
    // but a size measured in a run of its own is what it costs, whatever its neighbours do: a DFlash2 call of a
    // block of 4 costs 3.8-4.3 ms on an H100 and an H200 (the 27B at 4 096) against 4.2-4.9 for a block of 3, and
    // pooled with it drafting 3 was priced as dear as drafting 2 in the drafter (3 was 3-4% faster a token)
    for (j = 0; j < b.env.size(); ++j) {
        if (b.steady[j] && b.count[j] >= OWN_RUNS) {
            b.env[j] = b.eff[j];
        }
    }
}

void cost_table::export_points(int32_t table, std::vector<cost_point> & out, const bool * one_off_steady) const {
    for (int32_t bk = 0; bk < N_BUCKETS; ++bk) {
        const bucket_data & b = b_[bk];
        const bool as_steady = one_off_steady != nullptr && one_off_steady[bk];
        for (size_t j = 0; j < b.keys.size(); ++j) {
            if (b.count[j] >= 2 || !b.capped[j]) {  // a capped first run says little but that it was dear
                // a size measured only in one-off runs goes as seen once: the next session's runs replace it - but
                // where one-off runs cost what steady ones do (a CPU's), as measured: a size that only probes reach
                // is never run three times in a row, and measuring it again at every session would cost a long
                // draft, and a draft model's catch-up of the whole prompt, each time
                const bool steady = b.steady[j] || as_steady;
                out.push_back({ table, bk, b.keys[j], steady ? std::max(b.count[j], 2) : 1, b.eff[j] });
            }
        }
    }
}

void cost_table::import_point(int32_t bucket, int32_t n_tokens, int32_t count, double ms) {
    if (bucket < 0 || bucket >= N_BUCKETS || n_tokens < 1 || n_tokens > MAX_T || count < 1 || !(ms >= 0.0) ||
        !std::isfinite(ms)) {
        return;
    }
    bucket_data & b = b_[bucket];
    const auto it = std::lower_bound(b.keys.begin(), b.keys.end(), n_tokens);
    const size_t i = it - b.keys.begin();
    count = std::min(count, 2);
    if (it == b.keys.end() || *it != n_tokens) {
        b.keys.insert(it, n_tokens);
        b.ms.insert(b.ms.begin() + i, ms);
        b.count.insert(b.count.begin() + i, count);
        b.capped.insert(b.capped.begin() + i, 0);
        b.steady.insert(b.steady.begin() + i, count >= 2 ? 1 : 0);
        b.stale.insert(b.stale.begin() + i, 1);
        b.dear.insert(b.dear.begin() + i, 0);
        b.recent.insert(b.recent.begin() + i, std::vector<float>{});
    } else {
        b.ms[i] = ms;
        b.count[i] = count;
        b.capped[i] = 0;
        b.steady[i] = count >= 2 ? 1 : 0;
        b.stale[i] = 1;
        b.dear[i] = 0;
        b.recent[i].clear();
    }
    b.n_seen += count;
    rebuild(b);
}

double cost_table::predict_in(const bucket_data & b, int32_t n_tokens) const {
    // monotone envelope of the sizes seen, linear in between, the last slope beyond, the prior shape below
    const auto it = std::lower_bound(b.keys.begin(), b.keys.end(), n_tokens);
    const size_t i = it - b.keys.begin();
    if (it != b.keys.end() && *it == n_tokens) {
        return b.env[i];
    }
    if (i == 0) {
        // below the smallest size seen: the slope over the sizes seen, else the prior shape
        if (b.keys.size() > 1) {
            const size_t last = b.keys.size() - 1;
            const double slope = (b.env[last] - b.env[0]) / (double) (b.keys[last] - b.keys[0]);
            return std::max(0.1 * b.env[0], b.env[0] - slope * (b.keys[0] - n_tokens));
        }
        return b.env[0] * (1.0 + prior_slope * (n_tokens - 1)) / (1.0 + prior_slope * (b.keys[0] - 1));
    }
    if (i < b.keys.size()) {
        const double lo = b.env[i - 1], hi = b.env[i];
        const double line = lo + (hi - lo) * (n_tokens - b.keys[i - 1]) / (double) (b.keys[i] - b.keys[i - 1]);
        return i < 2 ? line : std::min(line, cliff_bound(b.keys[i - 2], b.env[i - 2], b.keys[i - 1], lo, n_tokens));
    }
    const size_t last = b.keys.size() - 1;
    double slope;
    if (last > 0) {
        // beyond the largest size seen: the average slope over all sizes seen (a flat last segment, an artefact of
        // the envelope or of noise, must not make every larger batch look free)
        slope = (b.env[last] - b.env[0]) / (double) (b.keys[last] - b.keys[0]);
    } else {
        slope = b.env[last] * prior_slope / (1.0 + prior_slope * (b.keys[last] - 1));
    }
    return b.env[last] + slope * (n_tokens - b.keys[last]);
}

double cost_table::predict_confirmed(const bucket_data & b, int32_t n_tokens) const {
    bucket_data c;
    for (size_t j = 0; j < b.keys.size(); ++j) {
        if (b.count[j] >= 2) {
            c.keys.push_back(b.keys[j]);
            c.ms.push_back(b.ms[j]);
        }
    }
    if (c.keys.empty()) {
        return 0.0;
    }
    double run = 0.0;
    for (double v : c.ms) {
        run = std::max(run, v);
        c.env.push_back(run);
    }
    return predict_in(c, n_tokens);
}

int32_t cost_table::nearest(int32_t bucket, size_t min_keys) const {
    // the nearest bucket (shallower first: costs only grow with depth) with at least min_keys sizes seen
    for (int32_t d = 0; d < N_BUCKETS; ++d) {
        if (bucket - d >= 0 && b_[bucket - d].keys.size() >= min_keys) {
            return bucket - d;
        }
        if (d > 0 && bucket + d < N_BUCKETS && b_[bucket + d].keys.size() >= min_keys) {
            return bucket + d;
        }
    }
    return -1;
}

double cost_table::predict(int32_t n_tokens, int32_t bucket) const {
    n_tokens = std::clamp(n_tokens, 1, MAX_T);
    bucket = std::clamp(bucket, 0, N_BUCKETS - 1);
    const bucket_data & b = b_[bucket];
    if (b.keys.size() >= 2 || (b.keys.size() == 1 && b.keys[0] == n_tokens)) {
        return predict_in(b, n_tokens);
    }
    const int32_t curve = nearest(bucket, 2);
    if (b.keys.size() == 1 && curve >= 0) {
        // one size seen at this depth (a calibration step): the shape of a neighbouring depth's curve, scaled to it
        const double at = predict_in(b_[curve], b.keys[0]);
        return at > 0.0 ? predict_in(b_[curve], n_tokens) * b.env[0] / at : predict_in(b, n_tokens);
    }
    if (!b.keys.empty()) {
        return predict_in(b, n_tokens);
    }
    const int32_t any = curve >= 0 ? curve : nearest(bucket, 1);
    if (any >= 0) {
        return predict_in(b_[any], n_tokens);
    }
    return prior_base * (1.0 + prior_slope * (n_tokens - 1));
}

bool cost_table::known(int32_t bucket) const {
    return bucket >= 0 && bucket < N_BUCKETS && b_[bucket].n_seen > 0;
}

int32_t cost_table::index_of(int32_t n_tokens, int32_t bucket) const {
    if (bucket < 0 || bucket >= N_BUCKETS) {
        return -1;
    }
    const auto & k = b_[bucket].keys;
    n_tokens = std::min(n_tokens, MAX_T);
    const auto it = std::lower_bound(k.begin(), k.end(), n_tokens);
    return it != k.end() && *it == n_tokens ? (int32_t) (it - k.begin()) : -1;
}

bool cost_table::known_at(int32_t n_tokens, int32_t bucket) const {
    return count_at(n_tokens, bucket) >= 1;
}

bool cost_table::confirmed_at(int32_t n_tokens, int32_t bucket) const {
    return count_at(n_tokens, bucket) >= 2;
}

int32_t cost_table::count_at(int32_t n_tokens, int32_t bucket) const {
    const int32_t i = index_of(n_tokens, bucket);
    return i < 0 ? 0 : b_[bucket].count[i];
}

double cost_table::steady_cost(int32_t n_tokens, int32_t bucket) const {
    const int32_t i = index_of(n_tokens, bucket);
    return i >= 0 && b_[bucket].steady[i] ? b_[bucket].ms[i] : -1.0;
}

double cost_table::reference(int32_t n_tokens, int32_t bucket) const {
    const double steady = steady_cost(n_tokens, bucket);
    if (steady >= 0.0) {
        return steady;
    }
    const double confirmed = predict_confirmed(b_[std::clamp(bucket, 0, N_BUCKETS - 1)], std::clamp(n_tokens, 1, MAX_T));
    return confirmed > 0.0 ? confirmed : -1.0;
}

bool cost_table::measured_for(int32_t n_tokens, int32_t bucket, int32_t min_count) const {
    return measured_in(n_tokens, n_tokens, bucket, min_count);
}

bool cost_table::measured_upto(int32_t n_tokens, int32_t bucket, int32_t min_count) const {
    return measured_in(1, n_tokens, bucket, min_count);
}

bool cost_table::measured_in(int32_t lo, int32_t hi, int32_t bucket, int32_t min_count) const {
    bucket = std::clamp(bucket, 0, N_BUCKETS - 1);
    hi = std::min(hi, MAX_T);
    auto at = [&](int32_t bk) {
        const bucket_data & b = b_[bk];
        for (size_t j = std::lower_bound(b.keys.begin(), b.keys.end(), lo) - b.keys.begin();
             j < b.keys.size() && b.keys[j] <= hi; ++j) {
            if (b.count[j] >= min_count) {
                return true;
            }
        }
        return false;
    };
    if (at(bucket)) {
        return true;
    }
    if (b_[bucket].keys.size() >= 2) {
        return false;
    }
    // where predict() looks for this depth: a neighbouring depth's curve, else any depth's sizes
    int32_t from = nearest(bucket, 2);
    if (from < 0 && b_[bucket].keys.empty()) {
        from = nearest(bucket, 1);
    }
    return from >= 0 && at(from);
}

bool cost_table::has_any() const {
    for (const auto & b : b_) {
        if (b.n_seen > 0) {
            return true;
        }
    }
    return false;
}

void cost_table::clear() {
    for (auto & b : b_) {
        b = bucket_data{};
    }
}

// ---- hazard counts -----------------------------------------------------------------------------

void hazard_counts::decay(double f) {
    for (size_t i = 0; i < acc.size(); ++i) {
        acc[i] *= f;
        tri[i] *= f;
    }
}

void hazard_counts::add(int32_t n_drafted, int32_t n_accepted) {
    n_drafted = std::min<int32_t>(n_drafted, (int32_t) tri.size());
    n_accepted = std::min(n_accepted, n_drafted);
    for (int32_t i = 0; i < n_accepted; ++i) {
        acc[i] += 1.0;
        tri[i] += 1.0;
    }
    if (n_accepted < n_drafted) {
        tri[n_accepted] += 1.0;  // the first rejection; later positions were never judged
    }
}

// ---- controller --------------------------------------------------------------------------------

controller::controller(const controller_params & p) : p_(p), rng_(p.seed) {
    p_.n_max = std::max(0, p_.n_max);
    p_.n_streams = std::max(1, p_.n_streams);
    p_.kv_window = std::max(1, p_.kv_window);
    s_.resize(p_.n_streams);
    for (auto & s : s_) {
        s.h_src[0].resize(std::max(1, p_.n_max));
        s.h_src[1].resize(std::max(1, p_.n_max));
    }
    pool_[0].resize(std::max(1, p_.n_max));
    pool_[1].resize(std::max(1, p_.n_max));
    // a drafter's call (a DFlash block, an n-gram lookup) may cost about the same at every length: its noisiest length
    // must not price the others (a running maximum made the 27B's call 5.5 ms at every length, 4.4-5.0 measured, and a fixed
    // cost per step that dear made a draft of 7 look as good as one of 5, 10% better in fact)
    draft_call_.pooled = true;
    target_.stall_confirmed = true;
    last_k_.assign(p_.n_streams, 0);
    for (auto & w : whole_) {
        w.assign(p_.n_max + 1, whole_cost{});
    }
    for (auto & s : s_) {
        s.led_real.assign(LEDGER_STEPS, 0.0);
        s.led_plain.assign(LEDGER_STEPS, 0.0);
        s.led_tok.assign(LEDGER_STEPS, 0.0);
    }
    reset_counters();
}

void controller::reset_counters() {
    counters_ = controller_counters{};
    counters_.k_hist.assign(p_.n_max + 1, 0);
}

void controller::reset_stream(int32_t stream) {
    if (stream < 0 || stream >= (int32_t) s_.size()) {
        return;
    }
    stream_state & s = s_[stream];
    // its acceptance evidence stays (it fades draft by draft as always): a new prompt's first few drafts must not
    // outweigh a hundred drafts of the session's (a prompt's drafts are rarely many), and a prompt that drafts
    // otherwise still overrides it within some tens of drafts
    s.src = 0;
    tok_prev_[0] = tok_prev_[1] = 0;  // a prompt was processed in between
    call_prev_ = 0;
    k_prev_[0] = k_prev_[1] = -1;
    // and a GPU may run each batch size's graph anew after it (eagerly, then captured: the 27B hybrid on an H200
    // re-captured every size it ran in the first steps after each prompt, +9-14 ms on 10-21 ms steps): those runs
    // count as a size's first runs, not as what a change between sizes costs (taken for that, they priced every
    // change of draft length at two steps, and the loop kept the length it had)
    std::fill(size_runs_.begin(), size_runs_.end(), size_runs{});
    std::fill(draft_runs_.begin(), draft_runs_.end(), size_runs{});  // (a draft model's graphs alike: 1.5 -> 2.2 ms, H100)
    s.explore_left = 0;
    s.probing = false;
    // (a second reset before any step - a session resets its streams, then starts the prompt's - changes nothing)
    if ((s.off || s.resume_gap > 0) && probes_dear(last_bucket_) && probe_gap_budget(stream, last_bucket_) > NEW_PROMPT_GAP_MAX) {
        // probes are dear here (a GPU's cold batches): the new prompt is judged by what the streams' drafts showed so
        // far (turned on at once where that says it pays), and if it stays off its probes keep their schedule -
        // at the rate the probe budget allows however short the prompts are
        s.resume_gap = s.off ? std::max(1, s.gap) : s.resume_gap;
        s.off = false;
        s.owed_run = 0;
        s.repeat_k = 0;
        s.probe_run = 0;
        s.steps = 0;
        return;
    }
    // a stream whose drafts did not pay in its last prompt probes a new one less eagerly (the same session's prompts
    // tend to be alike), yet soon enough to notice one that drafts well
    s.gap_len = s.off ? std::clamp(s.gap_len / 2, GAP_MIN, NEW_PROMPT_GAP_MAX) : GAP_MIN;
    s.off = false;
    s.gap = 0;
    s.resume_gap = 0;
    s.owed_run = 0;
    s.repeat_k = 0;
    s.probe_run = 0;
    s.steps = 0;
    // the ledger stays: it judges this machine's costs as much as the text's acceptance, and a generation is often
    // shorter than its window (a plain cost priced dear by one stalled run kept short generations drafting)
}

double controller::pooled(int32_t i, int32_t src, const hazard_counts * except) const {
    // the pool of every stream's drafts from this source, less one stream's own (its prior must not count its own
    // evidence again: one rejected draft would weigh several times)
    const hazard_counts & pool = pool_[src];
    auto acc = [&](size_t j) { return std::max(0.0, pool.acc[j] - (except ? except->acc[j] : 0.0)); };
    auto tri = [&](size_t j) { return std::max(0.0, pool.tri[j] - (except ? except->tri[j] : 0.0)); };
    double a = 0.0, t = 0.0;
    for (size_t j = 0; j < pool.acc.size(); ++j) {
        a += acc(j);
        t += tri(j);
    }
    const double overall = (a + PRIOR_WEIGHT * PRIOR_HAZARD) / (t + PRIOR_WEIGHT);
    if (i < 0 || i >= (int32_t) pool.acc.size()) {
        return overall;
    }
    return (acc(i) + PRIOR_WEIGHT * overall) / (tri(i) + PRIOR_WEIGHT);
}

double controller::hazard(const stream_state & s, int32_t i) const {
    // position i's own counts, shrunk towards the stream's rate at its other positions, itself shrunk towards the
    // other streams' pool: a position rarely tried (k seldom reaches it) follows what the stream does elsewhere, and
    // each draft is evidence once
    const hazard_counts & h = s.h();
    double a = 0.0, t = 0.0;
    for (size_t j = 0; j < h.acc.size(); ++j) {
        if ((int32_t) j != i) {
            a += h.acc[j];
            t += h.tri[j];
        }
    }
    const double stream_rate = (a + PRIOR_WEIGHT * pooled(i, s.src, &h)) / (t + PRIOR_WEIGHT);
    if (i >= (int32_t) h.acc.size()) {
        return stream_rate;
    }
    return (h.acc[i] + POSITION_WEIGHT * stream_rate) / (h.tri[i] + POSITION_WEIGHT);
}

double controller::hazard_hopeful(const stream_state & s, int32_t i, double z) const {
    // the hazard z standard errors higher, by the trials the stream's own drafts and its prior give
    const double h = hazard(s, i);
    if (z <= 0.0) {
        return h;
    }
    const hazard_counts & c = s.h();
    const double n = std::accumulate(c.tri.begin(), c.tri.end(), 0.0) + PRIOR_WEIGHT;
    return std::min(1.0, h + z * std::sqrt(h * (1.0 - h) / n));
}

std::vector<double> controller::pooled_hazards() const {
    std::vector<double> out(p_.n_max);
    for (int32_t i = 0; i < p_.n_max; ++i) {
        out[i] = pooled(i);
    }
    return out;
}

// A draft model's first and further decodes of n rows run one graph (one row per stream, most times): where one of the
// two tables has no steady run of the size and the other has, that run caps its price. On a GPU a size's further
// decodes are first runs of their own only in drafts longer than the stream's run (its probes), and a one-off's price
// (the 7B pair's draft model on an H100: 2.5 ms a row, 1.3 in runs) kept a stream at drafting 1 where 2 was 8% faster
static double same_graph_cost(const cost_table & own, const cost_table & other, int32_t rows, int32_t bucket) {
    const double p = own.predict(rows, bucket);
    const double run = other.steady_cost(rows, bucket);
    return own.steady_cost(rows, bucket) < 0.0 && run >= 0.0 ? std::min(p, run) : p;
}

double controller::draft_first_cost(int32_t rows, int32_t bucket) const {
    // a step's first draft decode costs about what a further decode costs, plus what each row it catches up
    // costs: held to that, so its one-off runs (a probe after plain steps; on a GPU its graph runs eagerly or is
    // captured) do not price the drafting of a run
    const double f = same_graph_cost(draft_first_, draft_rest_, rows, bucket);
    if (!draft_rest_.measured_upto(1, bucket, 2)) {
        return f;
    }
    // (two rows at most: a lone stream's in a run, its draft landed whole or not)
    const double per_row = rows <= 2 ? run_row_ms(bucket) : catchup_token_ms(bucket);
    return std::min(f, draft_rest_cost(1, bucket) + per_row * std::max(0, rows - 1));
}

double controller::draft_rest_cost(int32_t rows, int32_t bucket) const {
    return same_graph_cost(draft_rest_, draft_first_, rows, bucket);
}

double controller::catchup_token_ms(int32_t bucket) const {
    // the first decode's cost beyond one token per stream
    const double one = draft_first_.predict(1, bucket);
    const double more = draft_first_.predict(1 + 64, bucket);
    return std::max(0.0, (more - one) / 64);
}

double controller::run_row_ms(int32_t bucket) const {
    // what the draft landed whole adds to a run's first decode (its last token, caught up beside the committed one).
    // Where a size's first runs are dear (a GPU's graphs), the catch-ups it is learnt from (a size's first runs, most
    // of them) say little of it: there a row adds to the draft model's batch what it adds to the target's in runs, in
    // proportion (the draft model's batches are a target's in small). Priced by catch-ups, the 7B pair's draft model
    // on an H100 added 1.9 ms for that token (its 2-row decodes in runs cost what 1-row ones do, 1.3), and a stream at
    // p 0.8 stayed plain where drafting 2 was 17% faster
    const double learnt = catchup_token_ms(bucket);
    const double t1 = target_.predict(1, bucket);
    const double tn = target_.predict(1 + p_.n_max, bucket);
    if (p_.n_max < 1 || !first_runs_dear(bucket) || !(t1 > 0.0) || !(tn > 0.0) || !target_.measured_for(1, bucket, 2)) {
        return learnt;
    }
    return std::min(learnt, std::max(0.0, tn - t1) / p_.n_max / t1 * draft_rest_cost(1, bucket));
}

int32_t controller::catchup_limit(int32_t bucket) const {
    const double per_tok = catchup_token_ms(bucket);
    const double plain = plain_step_ms(1, bucket);
    if (!(per_tok > 0.0) || !(plain > 0.0)) {
        return 4096;
    }
    return (int32_t) std::clamp(CATCHUP_PLAIN_STEPS * plain / per_tok, 16.0, 4096.0);
}

double controller::plain_step_ms(int32_t n_active, int32_t bucket) const {
    return target_.predict(std::max(1, n_active), bucket) + (overhead_seen_plain_ ? overhead_plain_ : 0.0);
}

double controller::plain_ms_per_token(int32_t bucket) const {
    return plain_step_ms(1, bucket);
}

double controller::predict_step(const std::vector<int32_t> & k, const std::vector<int32_t> & active,
                                 const std::vector<int32_t> & pending, int32_t bucket,
                                 const std::vector<int32_t> & free) const {
    int32_t n_tok = 0, n_drafting = 0, k_max = 0, k_sum = 0, first = 0;
    const int32_t limit = p_.kind == DRAFTER_MODEL ? catchup_limit(bucket) : 0;
    for (size_t i = 0; i < k.size(); ++i) {
        if (!active[i]) {
            continue;
        }
        n_tok += k[i] + 1;
        if (k[i] > 0 && !(i < free.size() && free[i] > 0)) {  // a free draft costs the drafter nothing
            n_drafting++;
            k_max = std::max(k_max, k[i]);
            k_sum += k[i];
            first += 1 + std::min(pending.empty() ? 0 : pending[i], limit);
        }
    }
    double ms = target_.predict(n_tok, bucket);
    if (n_drafting == 0) {
        return ms + (overhead_seen_plain_ ? overhead_plain_ : 0.0);
    }
    switch (p_.kind) {
        case DRAFTER_MODEL:
            ms += draft_first_cost(first, bucket);
            for (int32_t it = 1; it < k_max; ++it) {
                int32_t n_it = 0;
                for (size_t i = 0; i < k.size(); ++i) {
                    n_it += active[i] && k[i] > it && !(i < free.size() && free[i] > 0);
                }
                ms += draft_rest_cost(n_it, bucket);
            }
            break;
        default:
            ms += draft_call_.predict(call_size(n_drafting, k_sum, k_max), 0);
            break;
    }
    return ms + (overhead_seen_spec_ ? overhead_spec_ : 0.0);
}

double controller::whole_fix(int32_t stream, int32_t k, int32_t bucket) const {
    if (k <= 0 || stream < 0 || stream >= (int32_t) s_.size()) {
        return 1.0;
    }
    const int32_t n = (int32_t) s_.size();
    std::vector<int32_t> kk(n, 0), act(n, 0), pend(n, 0);
    act[stream] = 1;
    pend[stream] = p_.kind == DRAFTER_MODEL ? 1 : 0;  // a steady run's draft model has a token or none to catch up
    // the measured length nearest to k (the shorter first): its whole step against the parts' sum now
    for (int32_t d = 0; d <= p_.n_max; ++d) {
        for (const int32_t m : { k - d, k + d }) {
            const whole_cost * w = m >= 1 && m <= p_.n_max && (d > 0 || m == k) ? whole_at(m, bucket) : nullptr;
            if (w == nullptr) {
                continue;
            }
            const double whole = w->ms;
            kk[stream] = m;
            const double parts = predict_step(kk, act, pend, bucket);
            if (whole > 0.0 && parts > 0.0) {
                return std::clamp(whole / parts, 0.5, 2.0);
            }
        }
    }
    return 1.0;
}

const controller::whole_cost * controller::whole_at(int32_t k, int32_t bucket) const {
    if (bucket < 0 || bucket >= cost_table::N_BUCKETS || k < 1 || k >= (int32_t) whole_[bucket].size()) {
        return nullptr;
    }
    const whole_cost & w = whole_[bucket][k];
    return w.count >= WHOLE_MIN || w.imported ? &w : nullptr;
}

double controller::predict_priced(const std::vector<int32_t> & k, const std::vector<int32_t> & active,
                                  const std::vector<int32_t> & pending, int32_t bucket,
                                  const std::vector<int32_t> & free, double * parts) const {
    const double ms = predict_step(k, active, pending, bucket, free);
    if (parts != nullptr) {
        *parts = ms;
    }
    int32_t lone = -1, n_active = 0;
    for (size_t i = 0; i < k.size() && i < active.size(); ++i) {
        if (active[i]) {
            n_active++;
            lone = (int32_t) i;
        }
    }
    // (an upstream drafter's call is learnt by its length already, as the target's batch is; on a CPU, where a batch
    // change costs nothing extra, the parts add up, and the choice stays as the class grid measured it)
    if (p_.kind != DRAFTER_MODEL || n_active != 1 || k[lone] <= 0 || (lone < (int32_t) free.size() && free[lone] > 0) ||
        !cold_dear(bucket)) {
        return ms;
    }
    return ms * whole_fix(lone, k[lone], bucket);
}

// One choice's view of the step: the depth bucket, who takes part, each stream's cap (a free draft's length
// bounds it) and free drafts.
struct controller::step_view {
    int32_t n = 0;
    int32_t n_active = 0;
    int32_t bucket = 0;
    int32_t cells = 0;          // the KV cells the active streams hold before the step
    std::vector<int32_t> free;  // length of a draft that exists at no cost, per stream
    std::vector<int32_t> cap;   // the most each stream may draft now
};

controller::step_view controller::view_of(const std::vector<int32_t> & caps, const std::vector<int32_t> & depth,
                                          const std::vector<int32_t> & active, const std::vector<int32_t> & free_len) {
    step_view v;
    v.n = (int32_t) s_.size();
    // a stream with a free draft drafts from it (no drafter cost), up to its length, judged by its own hazards
    v.free.assign(v.n, 0);
    v.cap.assign(v.n, 0);
    for (int32_t i = 0; i < v.n; ++i) {
        v.free[i] = i < (int32_t) free_len.size() ? std::max(0, free_len[i]) : 0;
        s_[i].src = v.free[i] > 0 ? 1 : 0;
    }
    double depth_sum = 0.0;
    for (int32_t i = 0; i < v.n && i < (int32_t) caps.size(); ++i) {
        const int32_t c = std::clamp(caps[i], 0, p_.n_max);
        v.cap[i] = v.free[i] > 0 ? std::min(c, v.free[i]) : c;
        if (active[i]) {
            v.n_active++;
            depth_sum += depth[i];
        }
    }
    v.bucket = v.n_active > 0 ? cost_table::bucket_of((int32_t) (depth_sum / v.n_active)) : 0;
    v.cells = (int32_t) std::min(depth_sum, 1e9);
    return v;
}

bool controller::calibrating(const step_view & v, const std::vector<int32_t> & active) {
    // plain steps where the plain cost at this depth was not measured in a steady run (the first runs may pay a
    // warm-up: a GPU graph captured), and now and then while speculating
    bool any_on = false;
    for (int32_t i = 0; i < v.n; ++i) {
        any_on = any_on || (active[i] && !s_[i].off && v.cap[i] > 0);
    }
    if (any_on && since_plain_ >= PLAIN_REFRESH && plain_owed_ == 0) {
        plain_owed_ = STEADY_RUN;  // a run of plain steps: a steady one refreshes the plain cost at this depth
        refreshed_ = true;
    }
    // (a size seen a few times counts as calibrated too: batches that change size every step - streams joining and
    // leaving - must not hold speculation off)
    const bool calibrated = target_.steady_cost(v.n_active, v.bucket) >= 0.0 ||
                            target_.count_at(v.n_active, v.bucket) >= 2 * STEADY_RUN;
    if (!calibrated || plain_owed_ > 0) {
        if (plain_owed_ > 0) {
            plain_owed_--;
        }
        return true;
    }
    return false;
}

int32_t controller::explore_cap(const step_view & v) {
    // before the drafter was ever measured, price it from the target's plain cost (optimistically)
    const double c1 = target_.predict(1, v.bucket);
    draft_first_.prior_base = 0.25 * c1;
    draft_rest_.prior_base = 0.15 * c1;
    draft_call_.prior_base = p_.kind == DRAFTER_NGRAM ? 0.01 * c1 : 0.3 * c1;
    // until a draft has been priced, drafts stay short: the first one measures what drafting costs here
    for (int32_t b = 0; b < cost_table::N_BUCKETS; ++b) {
        for (int32_t t = v.n_active + 1; t <= v.n_active * (p_.n_max + 1); ++t) {
            if (target_.known_at(t, b)) {
                return p_.n_max;
            }
        }
    }
    return PROBE_K;
}

double controller::plan_probes(const step_view & v, const std::vector<int32_t> & active, std::vector<int32_t> & k) {
    // streams that are off draft when their gap runs out - a little to learn acceptance, or at the size the best
    // case rests on to measure its cost - unless drafting could not pay even if every drafted token landed (then
    // nothing is learnt by probing, at a cost). Returns the tokens the step is expected to commit so far.
    double expect = v.n_active;  // every stream commits at least its target token
    for (int32_t i = 0; i < v.n; ++i) {
        stream_state & s = s_[i];
        s.probing = false;
        if (!active[i] || !s.off || v.free[i] > 0) {
            continue;  // on, or off with a free draft this step: the rows judge it, no probe needed
        }
        int32_t len = s.gap > 0 || v.cap[i] <= 0 ? 0
                      : s.repeat_k > 0         ? std::min(v.cap[i], s.repeat_k)
                                               : probe_len(i, v.cap[i], v.bucket, v.free, v.n_active == 1);
        const bool repeat = s.repeat_k > 0;
        s.repeat_k = 0;
        const double cost = probe_seen_[v.bucket] > 0 ? probe_fixed_ms(0.0, v.bucket) : 0.0;
        if (v.n_active == 1 && cold_dear(v.bucket) && cost > 0.0) {
            s.probe_credit = std::min(s.probe_credit + probe_budget(i) * plain_step_ms(1, v.bucket), PROBE_CREDIT_MAX * cost);
            // (a stream just turned off, or at a new prompt's first probes, probes on its schedule: the budget holds
            // back the probes of one that stayed off, whose gap grew past a new prompt's)
            // (a probe that measures a cost still owed is not held back)
            const bool measuring = repeat || len > PROBE_K || !target_.measured_for(1 + PROBE_K, v.bucket, 2);
            if (len > 0 && !s.hopeful && s.gap_len > NEW_PROMPT_GAP_MAX && s.probe_credit < cost && !measuring) {
                continue;  // due, but the budget has not earned it yet: the next step asks again
            }
        }
        if (len == PROBE_K && s.k_on > PROBE_K && cold_dear(v.bucket) && target_.measured_for(1 + PROBE_K, v.bucket, 2)) {
            // where a probe's cost is mostly its cold batch (a GPU's), one at the length the stream last drafted at
            // costs little more than a short one, lands more tokens, and says more of its acceptance (once the short
            // probe's size is measured: else the schedule keeps measuring it)
            len = std::min(v.cap[i], s.k_on);
        }
        if (s.gap <= 0 && len == 0) {
            s.gap = std::max(s.gap_len, GAP_MIN);
        } else if (s.gap <= 0) {
            k[i] = len;
            s.probing = true;
            double surv = 1.0;
            for (int32_t j = 0; j < k[i]; ++j) {
                surv *= hazard(s, j);
                expect += surv;
            }
        } else {
            s.gap--;
        }
    }
    return expect;
}

std::vector<int32_t> controller::best_lengths(const step_view & v, const std::vector<int32_t> & active,
                                              const std::vector<int32_t> & pending, std::vector<int32_t> k,
                                              double expect, int32_t explore_cap, std::vector<double> & lone_rate,
                                              lead_view & lead) const {
    // candidate rows of the streams that are on - and of those off whose step has a free draft (off means their
    // drafter does not pay; a free draft costs only its verify rows, and its own acceptance judges it) - best
    // survival first
    struct row { double surv; int32_t stream; int32_t pos; };
    std::vector<row> rows;
    for (int32_t i = 0; i < v.n; ++i) {
        if (!active[i] || (s_[i].off && v.free[i] == 0)) {
            continue;
        }
        double surv = 1.0;
        for (int32_t j = 0; j < std::min(v.cap[i], explore_cap); ++j) {
            surv *= hazard(s_[i], j);
            rows.push_back({ surv, i, j });
        }
    }
    std::stable_sort(rows.begin(), rows.end(), [](const row & a, const row & b) { return a.surv > b.surv; });

    // a lone stream's rate at the length it drafted at last: where another length is not better by HOLD_MARGIN, it
    // keeps that one (the hazards of deep positions rest on few drafts: where lengths price alike, their noise alone
    // would move the choice from step to step). A try of one position more for a single step is not a choice: the
    // length chosen before it is held (held instead, the 27B + DFlash2 on an H200 at p 0.8 climbed from 5 to 7 a try
    // at a time, 8% slower a token); a draft model's try runs until its whole step is measured, and is held
    int32_t lone = -1;
    for (int32_t i = 0; i < v.n && v.n_active == 1; ++i) {
        lone = active[i] ? i : lone;
    }
    int32_t held = lone >= 0 && !s_[lone].off && last_k_[lone] > 0 && last_k_[lone] == k_prev_[0] ? last_k_[lone] : -1;
    if (held > 0 && p_.kind != DRAFTER_MODEL && s_[lone].k_on > 0) {
        held = s_[lone].k_on;
    }
    // a target batch of another size than the last step's runs cold (on a GPU: eagerly, then its graph is captured):
    // where that is dear, a step that changes the size pays it once, priced over the few steps a length chosen holds
    // at the least (priced to the one step, the 27B on an H200 - whose changes between sizes that ran in the window
    // cost 0.3 ms, a few re-captures among them teaching 2.5 - kept drafting 6 and 7 where 5 was 2-8% faster a token).
    // A change is priced from the length held: the way back from a try was paid for when the try was taken (priced
    // again, the try's length kept, as good by its parts, for the rest of the answer)
    const double cold = cold_dear(v.bucket) ? SWITCH_WEIGHT * cold_ms() : 0.0;
    const int32_t tok_from = held > 0 && tok_prev_[0] > 0 ? held + 1 : tok_prev_[0];
    // after a step of plain decoding every draft changes the batch size: that cost decides whether to draft, not how
    // long - lengths are compared without it (priced into each, a cost as dear as a few steps favoured the longest
    // draft: replayed over the 27B + DFlash2's H200 costs, it took up 7 after a prompt's first plain steps and held
    // it, where 5 was 5% better a token)
    // - but not after the plain steps of a refresh of the plain cost, which streams that were drafting pay as the
    // refresh's cost: charged to their return, a pair that paid 15% over plain decoding (the 7B pair on an H100 at
    // p 0.8) found no length paying the change back in one step, and went plain until its probes turned it on again
    const bool from_plain = tok_from == v.n_active && !refreshed_;
    // and a size that has not run twice in this KV window yet owes its first runs there (a GPU's graph built, run
    // eagerly, captured): spread over the steps left in the window, so a length is left for a new size only where
    // it gains more than that within the window
    double parts = 0.0;  // the last step_cost's figure by the parts alone
    double leave = 0.0;  // the last step_cost's change from plain decoding, left out of its figure
    double paid = 0.0;   // the last step_cost's change between drafting lengths, in its figure
    auto step_cost = [&](const std::vector<int32_t> & kk) {
        int32_t t = 0;
        for (int32_t i = 0; i < v.n; ++i) {
            t += active[i] ? kk[i] + 1 : 0;
        }
        // (a change to or from plain decoding pays it whole: a stream turned off waits for its probes to turn it on
        // again - priced over SWITCH_SPREAD steps, the 27B's replay at p 0.6 stayed off for whole answers)
        const bool plain_side = t == v.n_active || from_plain;
        const double change = tok_from > 0 && t != tok_from ? (plain_side ? cold : cold / SWITCH_SPREAD) : 0.0;
        leave = from_plain ? change : 0.0;
        paid = change - leave;
        return predict_priced(kk, active, pending, v.bucket, v.free, &parts) + first_runs_ms(t, v.cells, expect) +
               (change - leave);
    };
    const std::vector<int32_t> k0 = k;
    std::vector<int32_t> best = k;
    const double start_cost = step_cost(k);
    const double start_rate = expect / (start_cost + leave);
    double best_rate = expect / start_cost;
    double best_whole = start_rate;  // the best rate of any length with the change from plain decoding
    lone_rate.assign(p_.n_max + 1, 0.0);
    double held_rate = 0.0;
    for (const row & r : rows) {
        if (k[r.stream] != r.pos) {
            continue;  // survival ties across positions: keep each stream's rows a prefix
        }
        k[r.stream]++;
        expect += r.surv;
        const double cost = step_cost(k);
        const double rate = expect / cost;
        if (v.n_active == 1 && k[r.stream] < (int32_t) lone_rate.size()) {
            lone_rate[k[r.stream]] = expect / parts;  // (a length whose neighbour measured dear may still be cheap)
        }
        if (r.stream == lone && k[r.stream] == held) {
            held_rate = rate;
        }
        if (r.stream == lone && k[r.stream] != held && expect / (cost - paid) > lead.rate) {
            lead.k = k[r.stream];  // the lone stream's best other length, its change left out
            lead.rate = expect / (cost - paid);
            lead.tokens = expect;
        }
        best_whole = std::max(best_whole, expect / (cost + leave));
        if (rate > best_rate) {
            best_rate = rate;
            best = k;
        }
    }
    if (from_plain && best_whole <= start_rate) {
        return k0;  // no length pays for leaving plain decoding now
    }
    if (held_rate > 0.0 && best[lone] > 0 && best[lone] != held && best_rate < held_rate * (1.0 + HOLD_MARGIN)) {
        best[lone] = held;
    }
    lead.stream = lone;
    lead.held = held_rate > 0.0 && best[lone] == held ? held : -1;
    lead.held_rate = held_rate;
    lead.change_ms = cold;
    return best;
}

void controller::switch_lead(const lead_view & lead, std::vector<int32_t> & best) {
    for (int32_t i = 0; i < (int32_t) s_.size(); ++i) {
        if (i != lead.stream || lead.held <= 0) {
            s_[i].lead_ms = 0.0;  // not the lone stream, or it keeps no length: no lead to build
        }
    }
    if (lead.stream < 0 || lead.held <= 0) {
        return;
    }
    double & lead_ms = s_[lead.stream].lead_ms;
    // the time the leading length would have saved this step (its tokens at either rate), less the drift
    const double held_ms = lead.tokens / lead.held_rate;
    const double saved = lead.k > 0 && lead.rate > lead.held_rate ? held_ms - lead.tokens / lead.rate : 0.0;
    lead_ms = std::max(0.0, lead_ms + saved - HOLD_DRIFT * held_ms);
    if (lead.k > 0 && lead_ms >= std::max(lead.change_ms, HOLD_EVIDENCE * held_ms)) {
        best[lead.stream] = lead.k;
        lead_ms = 0.0;
    }
}

void controller::follow_choice(const step_view & v, const std::vector<int32_t> & active, std::vector<int32_t> & best,
                               int32_t explore_cap, const std::vector<double> & lone_rate) {
    const double cold = SWITCH_WEIGHT * cold_ms();
    for (int32_t i = 0; i < v.n; ++i) {
        stream_state & s = s_[i];
        if (!active[i] || s.off) {
            continue;
        }
        const int32_t resumed = s.resume_gap;
        s.resume_gap = 0;
        if (best[i] == 0) {
            // does not pay now: off, probed later (soon if it had been paying for a while; where a new prompt found
            // it off, when its schedule says)
            s.off = true;
            s.explore_left = 0;
            if (resumed > 0) {
                s.gap = resumed;
            } else {
                s.misses = 0;  // it drafted: its probes start from the full budget
                s.gap_len = s.steps >= 4 * GAP_MIN ? GAP_MIN : std::max(GAP_MIN, s.gap_len);
                s.gap = s.gap_len;
            }
            s.steps = 0;
            continue;
        }
        s.steps++;
        s.k_on = best[i];
        // learn what one more position costs and how often it lands: often while its batch size was measured only
        // once (that run may have paid a warm-up), now and then otherwise
        int32_t t_next = 0;
        for (int32_t j = 0; j < v.n; ++j) {
            t_next += active[j] ? best[j] + 1 : 0;
        }
        uint32_t one_in = target_.confirmed_at(t_next + 1, v.bucket) ? EXPLORE_ONE_IN : EXPLORE_ONE_IN / 4;
        // a try of one more position changes the batch size twice (there and back): rarer where that is dear
        const double plain = plain_step_ms(1, v.bucket);
        if (plain > 0.0 && cold > 0.5 * plain) {
            one_in = (uint32_t) std::min(4096.0, one_in * EXPLORE_DEAR * cold / plain);
        }
        // and where its size owes its first runs in this KV window (a GPU's graph built, run eagerly, captured): with
        // a single step's try no longer held, tries every 8 steps paid them window after window
        const double owed = first_runs_ms(t_next + 1, v.cells, 1e9);
        if (plain > 0.0 && owed > COLD_DEAR * plain) {
            one_in = (uint32_t) std::min(4096.0, one_in * EXPLORE_DEAR * owed / plain);
        }
        const int32_t top = std::min(v.cap[i], explore_cap);
        if (s.explore_left > 0 && v.n_active == 1 && s.explore_k > best[i] && s.explore_k <= top) {
            s.explore_left--;  // a try in progress: its run goes on until its whole step was measured
            best[i] = s.explore_k;
            continue;
        }
        s.explore_left = 0;
        // a lone stream beside a draft model tries the next position at once where that length is predicted close to
        // the best one's and the position was hardly ever judged (its hazard is the stream's rate at its other
        // positions, or one old draft's luck): by lottery alone, where tries are dear, it would wait for hundreds of
        // steps - the 7B pair's H100 replay at p 0.9 drafted 1 through whole answers, one rejection at position 2 in a
        // probe of 4 pricing 2 at 0.99 of 1, where 2 was 8% faster a token
        const bool thin = p_.kind == DRAFTER_MODEL && v.n_active == 1 && best[i] > 0 &&
                          best[i] + 1 < (int32_t) lone_rate.size() && best[i] < (int32_t) s.h().tri.size() &&
                          s.h().tri[best[i]] < THIN_TRIALS && lone_rate[best[i] + 1] >= EXPLORE_CLOSE * lone_rate[best[i]];
        if (best[i] < top && (thin || (rng_() % one_in) == 0)) {
            // (a lone stream beside a drafter of its own length does not try a position whose costs were measured in
            // runs and could not pay were it to land every time: its rate by the parts is at most its hazard's inverse
            // higher. The 35B-A3B at p 0.9 on an H200's costs tried 8 past the cost cliff at 9 rows - 14 ms against 8
            // for 8 rows, and its first runs in the window - in one answer of five, 27 ms a try against 10 a step:
            // 0.98 of n7 replayed, 1.00 without those tries. A length not measured so is tried: its price is a guess
            // (skipped too, the 35B-A3B's H100 trace at p 0.8 replayed 0.95 of n7, against 0.97 or more). A draft
            // model's tries reach two positions on: below)
            const int32_t kk = best[i] + 1;
            if (v.n_active == 1 && p_.kind != DRAFTER_MODEL && kk < (int32_t) lone_rate.size() && lone_rate[kk] > 0.0 &&
                lone_rate[kk] < hazard(s, best[i]) * lone_rate[best[i]] &&
                target_.steady_cost(1 + kk, v.bucket) >= 0.0 && draft_call_.steady_cost(call_size(1, kk, kk), 0) >= 0.0) {
                continue;
            }
            const bool try_dear = cold_dear(v.bucket) || (p_.kind != DRAFTER_MODEL && first_runs_dear(v.bucket));
            if (v.n_active > 1 || !try_dear) {
                best[i]++;
                continue;
            }
            if (p_.kind != DRAFTER_MODEL) {
                // beside a drafter that reads the target's features, a try of a length whose target batch or drafter
                // call was never measured in a run is a run (as long as it takes to measure both steady) where a change
                // of batch size or a size's first runs in a KV window are dear, and its rate by the parts is predicted
                // close to the best one's (a run of a length predicted well below - past a MoE's cost cliff - costs its
                // 5 steps: replayed on the 35B-A3B's H200 trace at p 0.9, tries in runs at any length reached 0.975 of
                // n7, single tries 0.988): a single step measures only their cold runs. The 27B + DFlash2 at 4 096
                // drafted 2 at p 0.6 through whole answers on an H100 and an H200, its single tries of 3 costing 16-24
                // ms a verify and 4.5-6.6 a call against 13.6-14.5 and 3.8-4.3 in runs, where 3 was 3-4% faster a
                // token. Once measured, a try is one step: it learns how often the next position lands
                const int32_t call = call_size(1, kk, kk);
                const bool close = kk < (int32_t) lone_rate.size() && lone_rate[kk] >= EXPLORE_CLOSE * lone_rate[best[i]];
                if (close && (target_.steady_cost(1 + kk, v.bucket) < 0.0 || draft_call_.steady_cost(call, 0) < 0.0)) {
                    s.explore_k = kk;
                    s.explore_left = EXPLORE_RUN_PARTS - 1;
                }
                best[i] = kk;
                continue;
            }
            // a lone stream beside a draft model tries a longer draft in a run (where a batch's first runs are cold,
            // as long as it takes to measure its whole step steady) one or two positions on - the nearer one not yet
            // measured, else either: a cost curve need not be convex (the 7B pair on an H200: 3 dearer per token
            // than 2, 4 cheaper) - where its rate is predicted close to the best one's (a try of a length predicted
            // well below would rarely change the choice): else one step one position on, to learn how often that
            // position lands
            int32_t close[2], n_close = 0;
            for (int32_t j = 1; j <= 2; ++j) {
                const int32_t kj = best[i] + j;
                if (kj <= top && kj < (int32_t) lone_rate.size() && lone_rate[kj] >= EXPLORE_CLOSE * lone_rate[best[i]]) {
                    close[n_close++] = kj;
                }
            }
            if (n_close == 0) {
                best[i]++;
                continue;
            }
            int32_t pick = close[rng_() % n_close];
            for (int32_t j = n_close - 1; j >= 0; --j) {
                pick = whole_at(close[j], v.bucket) == nullptr ? close[j] : pick;  // the nearer one not yet measured
            }
            s.explore_k = pick;
            s.explore_left = EXPLORE_RUN - 1;
            best[i] = s.explore_k;
        }
    }
}

void controller::choose(const std::vector<int32_t> & caps, const std::vector<int32_t> & depth,
                        const std::vector<int32_t> & active, const std::vector<int32_t> & pending,
                        std::vector<int32_t> & k_out, const std::vector<int32_t> & free_len) {
    const step_view v = view_of(caps, depth, active, free_len);
    k_out.assign(v.n, 0);
    if (v.n_active == 0) {
        last_k_ = k_out;
        return;
    }
    last_bucket_ = v.bucket;
    if (!p_.adaptive) {
        const int32_t want = p_.schedule.empty() ? p_.n_max : p_.schedule[chosen_++ % p_.schedule.size()];
        for (int32_t i = 0; i < v.n; ++i) {
            k_out[i] = active[i] ? std::min(v.cap[i], std::max(0, want)) : 0;
        }
        last_k_ = k_out;
        return;
    }
    if (calibrating(v, active)) {
        last_k_ = k_out;
        return;
    }
    const int32_t cap = explore_cap(v);
    std::vector<int32_t> k(v.n, 0);
    const double expect = plan_probes(v, active, k);
    std::vector<double> lone_rate;
    lead_view lead;
    std::vector<int32_t> best = best_lengths(v, active, pending, k, expect, cap, lone_rate, lead);
    refreshed_ = false;
    switch_lead(lead, best);
    follow_choice(v, active, best, cap, lone_rate);
    since_plain_++;
    k_out = best;
    last_k_ = k_out;
}

void controller::ledger_add(stream_state & s, double realised_ms, double plain_ms, int32_t tokens) {
    s.led_real[s.led_pos % LEDGER_STEPS] = realised_ms;
    s.led_plain[s.led_pos % LEDGER_STEPS] = plain_ms;
    s.led_tok[s.led_pos % LEDGER_STEPS] = tokens;
    s.led_pos++;
    if (s.led_pos < LEDGER_STEPS) {
        return;
    }
    const double real = std::accumulate(s.led_real.begin(), s.led_real.end(), 0.0);
    const double plain = std::accumulate(s.led_plain.begin(), s.led_plain.end(), 0.0);
    const double window_tokens = std::accumulate(s.led_tok.begin(), s.led_tok.end(), 0.0);
    // lagging by more than a window's worth of acceptance luck: the model of costs or acceptance is wrong here
    if (plain > 0.0 && real > (1.0 + LEDGER_SLACK + LEDGER_Z / std::sqrt(std::max(1.0, window_tokens))) * plain) {
        // this stream's speculation lags plain decoding however the model explains it: off, probed from scratch
        counters_.n_guard++;
        s.off = true;
        s.misses = 0;
        s.gap_len = 2 * GAP_MIN;
        s.gap = s.gap_len;
        std::fill(s.led_real.begin(), s.led_real.end(), 0.0);
        std::fill(s.led_plain.begin(), s.led_plain.end(), 0.0);
        std::fill(s.led_tok.begin(), s.led_tok.end(), 0.0);
        s.led_pos = 0;
        plain_owed_ = STEADY_RUN;  // plain steps first: they re-measure the plain cost at this depth
    }
}

int32_t controller::probe_len(int32_t stream, int32_t cap, int32_t bucket, const std::vector<int32_t> & free,
                              bool alone) const {
    // the best case: every drafted token lands, nothing to catch up
    std::vector<int32_t> k(s_.size(), 0), act(s_.size(), 0), pend(s_.size(), 0);
    act[stream] = 1;
    const double plain = 1.0 / predict_step(k, act, pend, bucket, free);
    int32_t best = 0;
    double best_rate = plain;
    for (int32_t j = 1; j <= cap; ++j) {
        k[stream] = j;
        const double rate = (1.0 + j) / predict_step(k, act, pend, bucket, free);
        if (rate > best_rate) {
            best_rate = rate;
            best = j;
        }
    }
    if (best == 0 || best_rate <= BEST_CASE_MARGIN * plain) {
        // nothing pays by these costs (a best case barely above plain decoding is no case: acceptance is never 1);
        // believed once a short draft's cost was measured twice (a single run may have paid a warm-up) and the
        // ceiling's at least once, else measure what is missing
        if (!target_.measured_for(1 + PROBE_K, bucket, 2)) {
            return std::min(cap, PROBE_K);
        }
        if (!alone) {
            return 0;  // beside other streams a probe's batch is not the size to measure
        }
        // a draft model's probes after plain steps pay a catch-up (and, on a GPU, a graph for each new batch
        // shape): its steady cost - what every step of a paying run costs - comes from probes that follow probes
        if (drafting_owed(bucket)) {
            return std::min(cap, PROBE_K + 1);  // one further decode: its cost is measured too
        }
        // measured at this size or beyond: the sizes below are interpolated, not guessed. Once is enough where a
        // size's first runs cost what its steady ones do, or where that run is in line with plain decoding's and the
        // probe's costs; else it may have been a first run (a GPU's graph built, run eagerly, captured) and is
        // measured again: the first run of 9 tokens for the 7B pair on an H100 (23.8 ms, 7.6 in runs) ruled drafting
        // out for good in 2 of 8 seeds of its replay at p 0.9, where drafting 2 was 1.3 times as fast as plain
        const int32_t top = 1 + std::max(cap, p_.n_max);
        bool once = !first_runs_dear(bucket);
        if (!once) {
            const double c1 = target_.predict(1, bucket), c2 = target_.predict(1 + PROBE_K, bucket);
            once = true;
            for (int32_t n = 1 + cap; n <= top && once; ++n) {
                once = !target_.measured_for(n, bucket, 1) ||
                       target_.predict(n, bucket) <= IN_LINE * (c1 + (n - 1) * (c2 - c1) / PROBE_K);
            }
        }
        if (target_.measured_in(1 + cap, top, bucket, once ? 1 : 2)) {
            return 0;
        }
        return cap;
    }
    // the best case pays where it rests on a size never measured twice: measure that size (the gain expected at
    // it pays for much of the probe), else probe short to learn acceptance
    if (!alone || target_.measured_for(1 + best, bucket, 2)) {
        return std::min(cap, PROBE_K);
    }
    // a best case cut short by the cap (an answer's last tokens) rests on a size below one measured twice: the
    // sizes between are interpolated, not measured - each answer's end would otherwise measure the sizes its
    // shrinking cap makes best, one after another (the 35B-A3B with its experts on the CPU: 5-9 probes of 11-15
    // tokens, ten plain steps each, in 8 answers at zero acceptance, where short probes would have learnt more of it)
    const bool cut_short = best == cap && cap < p_.n_max;
    return cut_short && target_.measured_in(2 + cap, 1 + p_.n_max, bucket, 2) ? std::min(cap, PROBE_K) : best;
}

bool controller::drafting_owed(int32_t bucket) const {
    if (p_.kind != DRAFTER_MODEL) {
        return false;
    }
    // the first decode at a steady size seen twice; a further decode, once seen, seen twice (unseen, it is
    // priced optimistically, which cannot make drafting look worse than it is)
    return !draft_first_.measured_upto(STEADY_FIRST, bucket, 2) ||
           (draft_rest_.measured_upto(1, bucket, 1) && !draft_rest_.measured_upto(1, bucket, 2));
}

bool controller::worth_drafting(int32_t depth) const {
    if (!p_.adaptive || p_.kind != DRAFTER_MODEL || p_.n_max < 1) {
        return true;
    }
    const int32_t bucket = cost_table::bucket_of(depth);
    if (!target_.known(bucket) && !target_.has_any()) {
        return true;
    }
    return probe_len(0, p_.n_max, bucket, {}, true) > 0;
}

std::vector<cost_point> controller::export_costs() const {
    std::vector<cost_point> out;
    bool one_off_steady[cost_table::N_BUCKETS];
    for (int32_t b = 0; b < cost_table::N_BUCKETS; ++b) {
        one_off_steady[b] = once_is_enough(b);
    }
    target_.export_points(COST_TARGET, out, one_off_steady);
    draft_first_.export_points(COST_DRAFT_FIRST, out);
    draft_rest_.export_points(COST_DRAFT_REST, out);
    draft_call_.export_points(COST_DRAFT_CALL, out);
    for (int32_t b = 0; b < cost_table::N_BUCKETS; ++b) {
        for (int32_t k = 1; k < (int32_t) whole_[b].size(); ++k) {
            if (const whole_cost * w = whole_at(k, b)) {  // a length measured too few times to judge by stays here
                out.push_back({ COST_WHOLE, b, k, w->count, w->ms });
            }
        }
    }
    if (overhead_seen_plain_) {
        out.push_back({ COST_OVERHEAD_PLAIN, 0, 0, 1, overhead_plain_ });
    }
    if (overhead_seen_spec_) {
        out.push_back({ COST_OVERHEAD_SPEC, 0, 0, 1, overhead_spec_ });
    }
    if (cold_seen_) {
        out.push_back({ COST_COLD, 0, 0, 1, cold_ms() });
    }
    return out;
}

void controller::import_costs(const std::vector<cost_point> & pts) {
    for (const cost_point & c : pts) {
        switch (c.table) {
            case COST_TARGET:
                target_.import_point(c.bucket, c.n_tokens, c.count, c.ms);
                // the first steps run plain: a steady run of them prices plain decoding as the machine runs now,
                // which every choice is weighed against (another session's price may come from a busier or an idler time)
                plain_owed_ = STEADY_RUN;
                break;
            case COST_DRAFT_FIRST: draft_first_.import_point(c.bucket, c.n_tokens, c.count, c.ms); break;
            case COST_DRAFT_REST: draft_rest_.import_point(c.bucket, c.n_tokens, c.count, c.ms); break;
            case COST_DRAFT_CALL: draft_call_.import_point(c.bucket, c.n_tokens, c.count, c.ms); break;
            case COST_WHOLE:
                if (c.n_tokens >= 1 && c.n_tokens <= p_.n_max && c.bucket >= 0 && c.bucket < cost_table::N_BUCKETS) {
                    // judged by as measured, yet counted as two steps: what this session measures soon outweighs it
                    whole_[c.bucket][c.n_tokens] = { c.ms, std::min(c.count, 2), true };
                }
                break;
            case COST_OVERHEAD_PLAIN:
                if (c.ms >= 0.0 && std::isfinite(c.ms)) {
                    overhead_plain_ = c.ms;
                    overhead_seen_plain_ = true;
                }
                break;
            case COST_OVERHEAD_SPEC:
                if (c.ms >= 0.0 && std::isfinite(c.ms)) {
                    overhead_spec_ = c.ms;
                    overhead_seen_spec_ = true;
                }
                break;
            case COST_COLD:
                if (c.ms >= 0.0 && std::isfinite(c.ms)) {
                    cold_ms_ = c.ms;
                    cold_seen_ = true;
                }
                break;
            default: break;
        }
    }
}

int32_t controller::window_of(int32_t cells, int32_t n_tok) const {
    return std::max(0, cells + n_tok - 1) / p_.kv_window;
}

int32_t controller::note_run(std::vector<size_runs> & runs, int32_t n_tok, int32_t window) {
    if (n_tok < 0 || n_tok >= cost_table::MAX_T) {
        return 2;  // (prompt-sized batches are not tracked: their graphs are not kept)
    }
    if ((int32_t) runs.size() <= n_tok) {
        runs.resize(n_tok + 1);
    }
    const int32_t before = runs[n_tok].window == window ? runs[n_tok].runs : 0;
    // the graph of a size KEPT_GRAPHS apart is in the same slot: built over by this one
    for (int32_t n = n_tok % KEPT_GRAPHS; n < (int32_t) runs.size(); n += KEPT_GRAPHS) {
        runs[n].runs = 0;
    }
    runs[n_tok] = { window, std::min(before + 1, 2) };
    return before;
}

int32_t controller::runs_in_window(int32_t n_tok, int32_t window) const {
    if (n_tok < 0 || n_tok >= (int32_t) size_runs_.size()) {
        return n_tok >= cost_table::MAX_T ? 2 : 0;  // (prompt-sized batches are not tracked: their graphs are not kept)
    }
    return size_runs_[n_tok].window == window ? size_runs_[n_tok].runs : 0;
}

double controller::first_runs_ms(int32_t n_tok, int32_t cells, double per_step) const {
    const int32_t window = window_of(cells, n_tok);
    double owed = 0.0;
    for (int32_t r = runs_in_window(n_tok, window); r < 2; ++r) {
        owed += first_seen_[r] ? std::max(0.0, first_ms_[r]) : 0.0;
    }
    if (owed <= 0.0) {
        return 0.0;
    }
    const double left = std::max(0, (window + 1) * p_.kv_window - (cells + n_tok));
    return owed / (1.0 + left / std::max(1.0, per_step));
}

bool controller::once_is_enough(int32_t bucket) const {
    // (and a size's first runs in a KV window measured cheap too: else a size seen only once may have been seen in
    // those. They are this session's alone - a session seeded with another's costs has measured none yet, and what it
    // exports then is what it imported: judged by the cold cost alone, it exported a size the earlier session had
    // seen once as measured steadily)
    const double plain = plain_step_ms(1, bucket);
    const double first = (first_seen_[0] ? first_ms_[0] : 0.0) + (first_seen_[1] ? first_ms_[1] : 0.0);
    return cold_seen_ && first_seen_[0] && !cold_dear(bucket) && !(plain > 0.0 && first > COLD_DEAR * plain);
}

int32_t controller::call_size(int32_t n_drafting, int32_t k_sum, int32_t k_top) const {
    return p_.kind == DRAFTER_AUTOREGRESSIVE ? k_sum : p_.kind == DRAFTER_BLOCK ? n_drafting * (k_top + 1) : n_drafting;
}

bool controller::cold_dear(int32_t bucket) const {
    const double plain = plain_step_ms(1, bucket);
    return plain > 0.0 && cold_ms() > COLD_DEAR * plain;
}

bool controller::first_runs_dear(int32_t bucket) const {
    const double plain = plain_step_ms(1, bucket);
    return plain > 0.0 && first_seen_[0] && first_ms_[0] > COLD_DEAR * plain;
}

bool controller::probes_dear(int32_t bucket) const {
    // a probe changes the batch size: dear where that costs a cold run, or where its size owes its first runs (a
    // GPU's graphs kept by shape make a change between sizes that ran cheap, but a probe after plain steps finds
    // its size new to the window, or to a new prompt, most times)
    return cold_dear(bucket) || first_runs_dear(bucket);
}

double controller::probe_fixed_ms(double predicted, int32_t bucket) const {
    // a probe's cost beyond plain decoding: as its steady costs predict it, or as probes measured it here where that
    // is more (plus the cold run back to plain after it, which no probe's own step holds)
    const int32_t b = std::clamp(bucket, 0, cost_table::N_BUCKETS - 1);
    return probe_seen_[b] > 0 ? std::max(predicted, probe_excess_[b] + cold_ms()) : predicted;
}

bool controller::run_pays_evidence(int32_t stream, int32_t len, int32_t bucket) const {
    // a further step of a probe at this length, its batch warm, costs beyond a plain step at most half what the probe's
    // first step did (measured): then evidence comes cheaper from the run than from another probe
    if (len <= 0 || probe_seen_[std::clamp(bucket, 0, cost_table::N_BUCKETS - 1)] == 0) {
        return false;
    }
    std::vector<int32_t> k(s_.size(), 0), act(s_.size(), 0), pend(s_.size(), 0);
    act[stream] = 1;
    k[stream] = len;
    const double excess = predict_priced(k, act, pend, bucket, {}) - plain_step_ms(1, bucket);
    return excess < 0.5 * probe_fixed_ms(0.0, bucket);
}

double controller::probe_budget(int32_t stream) const {
    return s_[stream].misses >= SPARSE_AFTER ? SPARSE_BUDGET : PROBE_BUDGET;
}

double controller::probe_whole_ms(int32_t stream, int32_t bucket, const std::vector<int32_t> & free) const {
    // a lone probe's step beyond a plain one - its batch runs cold (its size did not run in the steps before), and so
    // does the plain step after it - as predicted or as probes measured it, plus the further steps of its run
    std::vector<int32_t> k(s_.size(), 0), act(s_.size(), 0), pend(s_.size(), 0);
    act[stream] = 1;
    k[stream] = PROBE_K;
    const double step = std::max(0.0, predict_step(k, act, pend, bucket, free) - plain_step_ms(1, bucket));
    const int32_t b = std::clamp(bucket, 0, cost_table::N_BUCKETS - 1);
    return probe_fixed_ms(step + 2.0 * cold_ms(), b) + probe_run_ms_[b];
}

int32_t controller::probe_gap_budget(int32_t stream, int32_t bucket) const {
    // steps between probes for them to cost the probe budget of plain decoding, a draft model's catch-up aside
    if (!target_.has_any()) {
        return GAP_MIN;
    }
    const double plain = plain_step_ms(1, bucket);
    const double fixed = probe_whole_ms(stream, bucket, {});
    return plain > 0.0 ? (int32_t) std::clamp(fixed / (probe_budget(stream) * plain), (double) GAP_MIN, (double) GAP_MAX)
                       : GAP_MIN;
}

int32_t controller::probe_gap_cap(int32_t stream, int32_t bucket, const std::vector<int32_t> & free) const {
    // a probe every g steps costs (fixed + catch-up of min(g, limit) tokens) / g; the smallest g within budget
    const bool is_free = stream < (int32_t) free.size() && free[stream] > 0;
    const double plain = plain_step_ms(1, bucket);
    const double fixed = probe_whole_ms(stream, bucket, free);
    const double per_tok = p_.kind == DRAFTER_MODEL && !is_free ? catchup_token_ms(bucket) : 0.0;
    const int32_t limit = p_.kind == DRAFTER_MODEL ? catchup_limit(bucket) : 0;
    const double budget = probe_budget(stream) * plain;
    // catching up costs per_tok per step waited: affordable when below the budget, else bounded by the limit
    double g = per_tok < budget ? fixed / (budget - per_tok) : INFINITY;
    if (!(g <= limit)) {
        g = (fixed + per_tok * limit) / budget;
    }
    if (!std::isfinite(g)) {
        g = GAP_MAX;
    }
    return (int32_t) std::clamp(g, 64.0, (double) GAP_MAX);
}

// What a step's observation adds up to: its streams, target rows, drafts, and the rows a draft model decoded.
struct controller::step_totals {
    int32_t n_active = 0, n_tok = 0, n_drafting = 0, n_model = 0, first = 0, k_sum = 0, k_top = 0, rest_rows = 0;
    int32_t committed = 0;
    int32_t behind = 0;  // the most tokens a drafting stream's drafter had to catch up on
    int32_t bucket = 0;
    int32_t cells = 0;   // the KV cells the active streams held before the step
    bool timed = false;  // the step verified only (no prompt rows): its costs are a verify's
};

controller::step_totals controller::totals_of(const step_obs & o) const {
    step_totals t;
    double depth_sum = 0.0;
    for (int32_t i = 0; i < (int32_t) s_.size() && i < (int32_t) o.active.size(); ++i) {
        if (!o.active[i]) {
            continue;
        }
        t.n_active++;
        depth_sum += o.depth[i];
        const int32_t d = o.n_drafted[i];
        t.n_tok += d + 1;
        t.committed += std::min(o.n_accepted[i], d) + 1;
        if (d > 0) {
            t.n_drafting++;
            t.k_sum += d;
            t.k_top = std::max(t.k_top, d);
            const bool from_model = o.source.empty() || !o.source[i];
            t.behind = std::max(t.behind, o.n_catchup.empty() ? 0 : o.n_catchup[i]);
            if (from_model) {
                t.n_model++;
                t.rest_rows += d - 1;
                t.first += 1 + (o.n_catchup.empty() ? 0 : o.n_catchup[i]);
            }
        }
    }
    t.bucket = t.n_active > 0 ? cost_table::bucket_of((int32_t) (depth_sum / t.n_active)) : 0;
    t.cells = (int32_t) std::min(depth_sum, 1e9);
    // a step that also processed prompts (continuous batching) says nothing of verify or overhead costs
    t.timed = o.t_step_ms >= 0.0 && o.t_target_ms >= 0.0;
    return t;
}

void controller::observe_costs(const step_obs & o, const step_totals & t) {
    // a batch of the size the two steps before ran is a steady run; one of another size is a one-off, whose extra
    // over the size's steady cost is learnt apart (the cold cost of changing the batch size)
    if (o.t_target_ms >= 0.0) {
        // (a size's first runs in a KV window are never steady: its graph is built for the window, then captured)
        const int32_t window = window_of(t.cells, t.n_tok);
        const int32_t runs = note_run(size_runs_, t.n_tok, window);
        const bool steady = runs >= 2 && t.n_tok == tok_prev_[0] && t.n_tok == tok_prev_[1];
        const double ref = runs < 2 ? target_.reference(t.n_tok, t.bucket) : target_.steady_cost(t.n_tok, t.bucket);
        // a one-off run dearer than COLD_MAX steady runs of its size stalled (a page fault, another process): it
        // says nothing of what changing the batch size costs (a GPU's eager run and capture cost up to about 3)
        if (!steady && ref >= 0.0 && o.t_target_ms - ref <= COLD_MAX * ref) {
            const double excess = o.t_target_ms - ref;
            double & ms = runs < 2 ? first_ms_[runs] : cold_ms_;
            bool & seen = runs < 2 ? first_seen_[runs] : cold_seen_;
            ms = seen ? ms + EMA * (excess - ms) : excess;
            seen = true;
        }
        target_.observe(t.n_tok, t.bucket, o.t_target_ms, steady, runs < 2 && first_runs_dear(t.bucket));
    }
    tok_prev_[1] = tok_prev_[0];
    tok_prev_[0] = o.t_target_ms >= 0.0 ? t.n_tok : 0;
    double draft_ms = 0.0;
    if (t.n_drafting > 0) {
        if (p_.kind == DRAFTER_MODEL) {
            // the draft model's batches are a target's in small: a size's first two runs in a window are not steady
            // (on a GPU they are dear, and not what the size costs in a run of drafts). Taken for it, they priced
            // drafting out: the 7B pair's drafter on an H100 decoded 1-2 rows in 3-5 ms on its first two runs against
            // 1.2-1.5 ms after, and probes - whose decodes are first runs, most of them - kept the stream plain at an
            // acceptance of 0.8, where drafting 2 was 15% faster. Counted as runs only where such runs were known to be
            // dear, a probe of 8's further decodes at 16 384 (3.7 ms a row against 1.6), before that was known, set the
            // price of a decode of 1 for good
            const bool dear = first_runs_dear(t.bucket);
            const int32_t window = window_of(t.cells, 1);
            if (t.n_model > 0) {
                const int32_t runs = note_run(draft_runs_, t.first, window_of(t.cells, t.first));
                draft_first_.observe(t.first, t.bucket, o.t_draft_first_ms, runs >= 2, dear && runs < 2);
            }
            if (t.n_model > 0 && o.n_draft_iters > 0) {
                const int32_t per_iter = std::max(1, (int32_t) std::lround((double) t.rest_rows / o.n_draft_iters));
                const int32_t runs = note_run(draft_runs_, per_iter, window);
                if (o.n_draft_iters > 1) {
                    note_run(draft_runs_, per_iter, window);  // (a count that stops at 2: one more run says the rest)
                }
                draft_rest_.observe(per_iter, t.bucket, o.t_draft_rest_ms / o.n_draft_iters, runs >= 2,
                                    dear && runs < 2);
            }
            draft_ms = o.t_draft_first_ms + o.t_draft_rest_ms + o.t_draft_call_ms;  // lookups beside the model
        } else {
            const int32_t size = call_size(t.n_drafting, t.k_sum, t.k_top);
            // a drafter that reads the target's features (DFlash, EAGLE3, MTP) first takes in those of the tokens
            // decoded since it last ran: after plain steps (a probe) its call is that much dearer - a cost of the
            // plain steps before, not of drafting, which priced by it would look too dear to turn back on. A block
            // drafter's batch is as long as the draft: a call of another size than the step before's runs its graph
            // cold (built, run eagerly, captured anew after a prompt) - a one-off, as a target batch of a new size is
            // (counted in, the 27B's DFlash2 calls after a change of length, 6.1-6.3 ms at 6 and 7 against 5.1-5.4 in
            // runs, made drafts of 6 and 7 look as cheap as one of 5 on an H200, where 5 was 3-5% better a token)
            // And its call's graph is the drafter context's, built for a KV window as the target's are: a size's
            // first two calls in a window cost 6-13 ms where later ones cost 4-5 (27B + DFlash2, H100). Taken as
            // steady, the second of them priced drafting 3 at 9.4 ms a call at 4 096 (and 6 at 9.8, 7 at 6.9 at
            // depth 0) for good - no single try's call is steady - and the stream drafted 2 where 3 was 3% faster a
            // token, 5 where 7 was 4% faster
            bool steady = p_.kind != DRAFTER_BLOCK || size == call_prev_;
            bool cold = false;
            if (p_.kind == DRAFTER_BLOCK && first_runs_dear(t.bucket)) {
                const int32_t runs = note_run(draft_runs_, size, window_of(t.cells, size));
                steady = steady && runs >= 2;
                cold = runs < 2;
            }
            if (t.behind <= p_.n_max + 1) {
                draft_call_.observe(size, 0, o.t_draft_call_ms, steady, cold);
            }
            draft_ms = o.t_draft_call_ms;
            call_prev_ = t.timed ? size : 0;
        }
    } else {
        call_prev_ = 0;
    }
    // a lone stream's whole step at its draft model's draft length: learnt in a steady run (the length of the two steps
    // before) of drafts from the model, caught up as a run is
    const int32_t k_now = t.timed && t.n_active == 1 ? t.k_top : -1;
    const bool drafter_steady = p_.kind == DRAFTER_MODEL && t.n_drafting == 1 && t.n_model == 1 && t.behind <= 1;
    if (k_now > 0 && drafter_steady && k_now == k_prev_[0] && k_now == k_prev_[1]) {
        whole_cost & w = whole_[t.bucket][std::min(k_now, p_.n_max)];
        // a mean over the last WHOLE_MEMORY steps or so; a stall (a page fault, another process) moves it by a bounded step
        const double x = w.count >= 2 ? std::min(o.t_step_ms, w.ms * (1.0 + 4.0 * STALL_STEP)) : o.t_step_ms;
        w.count = std::min(w.count + 1, WHOLE_MEMORY);
        w.ms += (x - w.ms) / w.count;
    }
    k_prev_[1] = k_prev_[0];
    k_prev_[0] = k_now;
    const double rest = std::max(0.0, o.t_step_ms - o.t_target_ms - draft_ms);
    if (!t.timed) {
        return;  // nothing to learn about overhead
    }
    if (t.n_drafting > 0) {
        overhead_spec_ = overhead_seen_spec_ ? overhead_spec_ + EMA * (rest - overhead_spec_) : rest;
        overhead_seen_spec_ = true;
    } else {
        overhead_plain_ = overhead_seen_plain_ ? overhead_plain_ + EMA * (rest - overhead_plain_) : rest;
        overhead_seen_plain_ = true;
        since_plain_ = 0;
    }
}

void controller::observe_acceptance(const step_obs & o) {
    for (int32_t i = 0; i < (int32_t) s_.size(); ++i) {
        if (!o.active[i]) {
            continue;
        }
        const int32_t d = o.n_drafted[i];
        const int32_t a = std::min(o.n_accepted[i], d);
        counters_.k_hist[std::clamp(d, 0, p_.n_max)]++;
        if (d <= 0) {
            continue;
        }
        stream_state & s = s_[i];
        // a probe that lands means the content may have changed: the old evidence against drafting fades faster
        // (once a probe: the further steps of its run are evidence of the same content)
        const double f = !(s.probing && a > 0 && s.probe_run == 0) ? HAZARD_DECAY : PROBE_LANDED_DECAY;
        s.src = i < (int32_t) o.source.size() && o.source[i] ? 1 : 0;
        s.h().decay(f);
        s.h().add(d, a);
        pool_[s.src].decay(f < HAZARD_DECAY ? f : POOL_DECAY);
        pool_[s.src].add(d, a);
    }
}

void controller::observe_ledgers(const step_obs & o, const step_totals & t) {
    // plain-decoding estimate of what was committed (once plain decoding was measured at this depth), and each
    // drafting stream's ledger: its share of the step's time (by verified rows) against plain decoding's
    const double plain_tok = plain_step_ms(t.n_active, t.bucket) / t.n_active;
    if (target_.known_at(t.n_active, t.bucket) || target_.known_at(1, t.bucket)) {
        counters_.est_plain_ms += t.committed * plain_tok;
    }
    if (!p_.adaptive || t.n_drafting == 0 || !t.timed) {
        return;
    }
    for (int32_t i = 0; i < (int32_t) s_.size(); ++i) {
        if (o.active[i] && o.n_drafted[i] > 0) {
            const int32_t rows = o.n_drafted[i] + 1;
            const int32_t got = std::min(o.n_accepted[i], o.n_drafted[i]) + 1;
            ledger_add(s_[i], o.t_step_ms * rows / t.n_tok, got * plain_tok, got);
        }
    }
}

bool controller::probe_pays(const step_obs & o, const step_totals & t, int32_t i, double z) const {
    // would drafting pay for stream i next to what the others drafted in this step?
    const int32_t n = (int32_t) s_.size();
    std::vector<int32_t> k(n, 0), act(o.active.begin(), o.active.begin() + n), pend(n, 0);
    double others = 0.0;
    for (int32_t j = 0; j < n; ++j) {
        if (j != i && act[j]) {
            k[j] = std::min(o.n_drafted[j], s_[j].off ? 0 : o.n_drafted[j]);
            double surv = 1.0;
            for (int32_t q = 0; q < k[j]; ++q) {
                surv *= hazard(s_[j], q);
                others += surv;
            }
        }
    }
    // priced as the next step will be: a draft model whose draft landed whole catches up one token more
    for (int32_t j = 0; j < n && p_.kind == DRAFTER_MODEL; ++j) {
        pend[j] = act[j] && o.n_drafted[j] > 0 && o.n_accepted[j] >= o.n_drafted[j] ? 1 : 0;
    }
    std::vector<int32_t> free_i(n, 0);
    free_i[i] = s_[i].src;
    const double base = (t.n_active + others) / predict_step(k, act, pend, t.bucket, free_i);
    // turning drafting on changes the batch size (and back, some time later): its cold runs, over the steps it is
    // expected to last, are part of what drafting must earn
    const double switch_ms = cold_dear(t.bucket) ? 2.0 * SWITCH_WEIGHT * cold_ms() / SWITCH_STEPS : 0.0;
    double expect = t.n_active + others, surv = 1.0;
    for (int32_t j = 0; j < p_.n_max; ++j) {
        surv *= hazard_hopeful(s_[i], j, z);
        expect += surv;
        k[i] = j + 1;
        if (expect / (predict_priced(k, act, pend, t.bucket, free_i) + switch_ms) > PROBE_PAYS_MARGIN * base) {
            return true;
        }
    }
    return false;
}

void controller::observe_probes(const step_obs & o, const step_totals & t) {
    // probe outcomes: back on when drafting would now pay for this stream alone, else probe less often
    const int32_t n = (int32_t) s_.size();
    const bool reads_batches = p_.kind == DRAFTER_BLOCK || p_.kind == DRAFTER_AUTOREGRESSIVE;
    for (int32_t i = 0; i < n; ++i) {
        stream_state & s = s_[i];
        if (!o.active[i] || !s.probing) {
            continue;
        }
        s.probing = false;
        counters_.n_probes++;
        if (t.n_active == 1 && t.timed && k_prev_[1] == 0 && o.t_step_ms > 0.0) {
            // a lone stream's probe after plain steps: what it cost beyond a plain step (a draft model's catch-up
            // aside: the schedule prices that by the gap) - what the schedule is set by, but for a drafter reading
            // every batch where the probe was longer than probes are (one that measured a long draft's batch pays
            // that batch's first runs: on an H100 the 35B-A3B's of 15 tokens cost 117 ms, and probes priced by it
            // came once in ~1 000 steps)
            const double behind = p_.kind == DRAFTER_MODEL && i < (int32_t) o.n_catchup.size()
                                      ? catchup_token_ms(t.bucket) * std::max(0, o.n_catchup[i] - 1) : 0.0;
            const double x = std::max(0.0, o.t_step_ms - plain_step_ms(1, t.bucket) - behind);
            if (!(reads_batches && o.n_drafted[i] > std::max(PROBE_K, s.k_on))) {
                double & e = probe_excess_[t.bucket];
                e = probe_seen_[t.bucket]++ == 0 ? x : e + PROBE_EXCESS_RATE * (x - e);
            }
            s.probe_credit = std::max(s.probe_credit - x - cold_ms(), -PROBE_CREDIT_MAX * probe_fixed_ms(0.0, t.bucket));
            s.run_ms = 0.0;
        } else if (t.n_active == 1 && t.timed && s.probe_run > 0 && o.t_step_ms > 0.0) {
            // a further step of a probe's run: what it cost beyond plain decoding of the tokens it committed
            const int32_t got = std::min(o.n_accepted[i], o.n_drafted[i]) + 1;
            const double beyond = o.t_step_ms - got * plain_step_ms(1, t.bucket);
            s.probe_credit =
                std::max(s.probe_credit - std::max(0.0, beyond), -PROBE_CREDIT_MAX * probe_fixed_ms(0.0, t.bucket));
            s.run_ms += beyond;
        }
        // where the batch change is dear and the drafter reads every target batch, a stay off costs cold runs both
        // ways and a catch-up on return: the probe's own luck (one token, landed or not) is judged with the hope of
        // one standard error, as its schedule is
        if (probe_pays(o, t, i, cold_dear(t.bucket) && reads_batches ? PROBE_HOPE : 0.0)) {
            s.off = false;
            s.steps = 0;
            s.probe_run = 0;
            s.run_ms = 0.0;  // (a run that turned drafting on cost drafting's time, not probing's)
            s.misses = 0;
            continue;
        }
        // the gap grows, capped where probing costs the stream's probe budget of plain decoding; dear probes start
        // sparse - but a cost still to measure is measured soon, while a draft model has little to catch up
        std::vector<int32_t> free(n, 0);
        free[i] = s.src;
        const int32_t cap = probe_gap_cap(i, t.bucket, free);
        const int32_t next = probe_len(i, p_.n_max, t.bucket, free, t.n_active == 1);
        const bool owed = next > PROBE_K || (next > 0 && !target_.measured_for(1 + PROBE_K, t.bucket, 2));
        // drafting's steady cost is measured by the very next step (a few in a row at most), and a short probe's
        // batch in a steady run by the same probe again (its first runs on a GPU capture or run eagerly; a long
        // probe's size, measured once, is held to the line of the short ones)
        const bool repeat = t.n_active == 1 && o.n_drafted[i] <= PROBE_K + 1 && target_.steady_cost(t.n_tok, t.bucket) < 0.0;
        const bool follow = next > 0 && t.n_active == 1 && (drafting_owed(t.bucket) || repeat) &&
                            ++s.owed_run < OWED_RUN_MAX;
        if (!follow) {
            s.owed_run = 0;
        }
        s.repeat_k = follow && repeat ? o.n_drafted[i] : 0;
        // where probes are dear (a GPU's, spaced widely) and drafting would pay at an acceptance a standard error
        // better than estimated (few drafts, or near break-even), the next probe comes sooner, not later: a run of
        // bad luck at an acceptance that pays is outweighed within a few probes, not generations
        const bool maybe = probe_pays(o, t, i, PROBE_HOPE);
        const bool plausible = cold_dear(t.bucket) && maybe;
        s.hopeful = plausible;
        // a drafter reading every batch probes in runs (PROBE_RUN): one starts at a probe after plain steps, not after
        // probes that measured a cost, and goes on while drafting is not hopeless
        const bool run = reads_batches && !follow && !owed && t.n_active == 1 &&
                         (s.probe_run > 0 || k_prev_[1] == 0) && probes_dear(t.bucket) &&
                         run_pays_evidence(i, o.n_drafted[i], t.bucket) && probe_pays(o, t, i, PROBE_RUN_HOPE);
        if (run && ++s.probe_run < PROBE_RUN) {
            s.repeat_k = o.n_drafted[i];  // the same length again, its batch now warm; the interval stays
            s.gap = 0;
            continue;
        }
        if (!follow && !owed) {
            // the run ends: what its further steps cost is the probe's too (a probe without one counts nothing)
            double & r = probe_run_ms_[t.bucket];
            r += PROBE_EXCESS_RATE * (std::max(0.0, s.run_ms) - r);
        }
        s.run_ms = 0.0;
        s.probe_run = 0;
        // a token landing after probes that found drafting hopeless says the content may have changed: the next probe
        // comes at once (probed sparsely, a change would otherwise wait for several long intervals to show). A landing
        // alone does not end the sparse budget: at a steady acceptance below break-even most probes land a token
        // (their runs did at p 0.3), and only drafting found plausible does
        const bool landed = o.n_accepted[i] > 0;
        const bool surprise = landed && s.misses >= SPARSE_AFTER;
        if (!follow && !owed) {
            s.misses = maybe ? 0 : s.misses + 1;
        }
        s.gap_len = follow                 ? 0
                    : owed || surprise     ? GAP_MIN
                    : plausible            ? std::max(GAP_MIN, s.gap_len / 2)
                                           : std::min(std::max(2 * s.gap_len, cap / 4), cap);
        s.gap = s.gap_len;
    }
}

void controller::observe(const step_obs & o) {
    const step_totals t = totals_of(o);
    if (t.n_active == 0) {
        return;
    }
    steps_++;
    observe_costs(o, t);
    observe_acceptance(o);
    observe_ledgers(o, t);
    if (p_.adaptive) {
        observe_probes(o, t);
    }
}

}  // namespace pls
