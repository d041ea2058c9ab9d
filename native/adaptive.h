// The draft-length controller: chooses, every step and for every stream, how many drafted tokens to verify
// (k in 0..n_max; 0 decodes plainly) so that committed tokens per second are highest.
//
// It knows nothing of llama.cpp: the loop tells it what each step cost and what was accepted, so it can be
// driven by a simulation with an injected clock. Costs are measured online on this machine, never assumed:
//   - the target batch by its token count, per context-depth bucket (monotone, interpolated between the
//     sizes seen, extrapolated from the last slope);
//   - a draft model's first decode of a step (by tokens in it: catch-up included) and each further decode (by
//     streams still drafting);
//   - an upstream drafter's call (EAGLE3/MTP per token, DFlash/DSpark per block, n-gram lookup);
//   - the per-step overhead that is neither (rollback, bookkeeping), as the remainder of wall time;
//   - what a batch size's first two runs in a window of the KV cache cost beyond its steady runs (a GPU builds its
//     graph for the window, runs it eagerly, then captures it), apart from a change between sizes that ran there -
//     a size that still owes them is priced by them, spread over the steps left in the window;
//   - a lone stream's whole step by its draft model's draft length, from steady runs: where a batch change is dear (a
//     GPU's) the decodes do not add up, and the parts' sum (at a length measured, or the nearest one) is scaled to it;
//     a try of a longer draft runs long enough there to measure it, one or two positions on.
// Acceptance is a per-stream hazard model: h_i = P(position i accepted | positions before it were), from
// decayed counts with a prior pooled over streams and positions. A step's allocation is the prefix of
// (stream, position) rows, taken in order of survival probability, that maximises
//     (streams + sum of survivals) / (draft cost + target cost + overhead).
// While a stream sits at k = 0 it is probed with a short draft at growing intervals, the gap capped so the
// probes cost at most ~2% of plain decoding (where probes are dear and the drafter reads every target batch, a
// probe goes on for a few steps while drafting is not hopeless) - unless drafting could not pay even if every drafted
// token landed, by costs measured here (a probe measures the batch size that verdict rests on, early): then nothing is
// probed, and a draft model does not read new prompts. A ledger of realised time against estimated plain time
// over a window turns speculation off when it lags. Costs can be exported and imported, so a later session of
// the same setup starts from them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace pls {

enum drafter_kind : int32_t {
    DRAFTER_NONE = 0,
    DRAFTER_MODEL = 1,           // a draft model driven by the shim: per-token decodes, detachable (k = 0 skips it)
    DRAFTER_AUTOREGRESSIVE = 2,  // an upstream drafter drafting token by token (EAGLE3, MTP); processes every batch
    DRAFTER_BLOCK = 3,           // one pass per draft whatever its length (DFlash, DSpark); processes every batch
    DRAFTER_NGRAM = 4,           // lookup in the context: almost free
};

// One learnt cost, as exported and imported (tables: COST_*).
enum cost_table_id : int32_t {
    COST_TARGET = 0,
    COST_DRAFT_FIRST = 1,
    COST_DRAFT_REST = 2,
    COST_DRAFT_CALL = 3,
    COST_OVERHEAD_PLAIN = 4,  // n_tokens 0
    COST_OVERHEAD_SPEC = 5,   // n_tokens 0
    COST_COLD = 6,            // n_tokens 0
    COST_WHOLE = 7,           // a lone stream's whole step, by its draft length (n_tokens = k)
};
struct cost_point {
    int32_t table = 0;
    int32_t bucket = 0;
    int32_t n_tokens = 0;
    int32_t count = 0;
    double ms = 0.0;
};

// Cost of a batch by its token count, per depth bucket, learnt by EMA per size.
class cost_table {
public:
    static constexpr int N_BUCKETS = 8;
    static constexpr int MAX_T = 1024;

    static int bucket_of(int32_t depth);

    // steady: the same size ran in the steps before (false: a one-off run, which on a GPU pays its graph's capture
    // or an eager run; once a size was measured in steady runs its one-off runs are not learnt from). cold: one of
    // the size's first runs in its KV window, where those are dear (a GPU's graph built, run eagerly, captured): a
    // size's first run is taken as ever (capped by what the sizes measured predict); later cold runs never raise what a
    // size is believed to cost
    void observe(int32_t n_tokens, int32_t bucket, double ms, bool steady = true, bool cold = false);
    // predicted cost; falls back to the nearest shallower bucket with data, then to prior(n_tokens)
    double predict(int32_t n_tokens, int32_t bucket) const;
    bool known(int32_t bucket) const;
    bool known_at(int32_t n_tokens, int32_t bucket) const;
    bool confirmed_at(int32_t n_tokens, int32_t bucket) const;  // seen at least twice
    // measured at least min_count times here, or - where this depth has only a calibration step or nothing - where
    // predict() looks for it (a neighbouring depth's curve, else any depth's sizes)
    bool measured_for(int32_t n_tokens, int32_t bucket, int32_t min_count) const;
    // the same for any size up to n_tokens, and for any size from lo to hi
    bool measured_upto(int32_t n_tokens, int32_t bucket, int32_t min_count) const;
    bool measured_in(int32_t lo, int32_t hi, int32_t bucket, int32_t min_count) const;
    bool has_any() const;
    void clear();
    // the size's own cost learnt from steady runs at this depth (no envelope, nothing borrowed), -1 where none
    double steady_cost(int32_t n_tokens, int32_t bucket) const;
    // what a run of the size should cost: its steady cost, else what the sizes seen at least twice at this depth
    // predict for it (a size's first runs are judged by it), -1 where neither
    double reference(int32_t n_tokens, int32_t bucket) const;
    int32_t count_at(int32_t n_tokens, int32_t bucket) const;  // observations of this size at this depth

    // what was learnt, to seed a later session on the same machine
    // one_off_steady[b]: at depth bucket b a one-off run costs what a steady one does (no cold batches), so a size
    // seen only in one-off runs goes as measured - else as seen once, for the next session to measure again
    void export_points(int32_t table, std::vector<cost_point> & out, const bool * one_off_steady = nullptr) const;
    void import_point(int32_t bucket, int32_t n_tokens, int32_t count, double ms);

    double prior_base = 0.0;   // used only while nothing at all was observed
    double prior_slope = 0.25; // relative cost of each extra token in that case
    // the envelope: the closest non-decreasing fit of the sizes' costs (sizes that disagree pooled, isotonic) rather
    // than their running maximum - for a cost that hardly grows with the size, whose noisiest small size would set
    // every larger one's (a DFlash block's call)
    bool pooled = false;
    // a run far dearer than its size's cost counts once the size's next run is dear too (a stall is one run long):
    // for a table whose steady runs cost alike (a target's verify), not one whose runs vary with what they take in
    bool stall_confirmed = false;

private:
    struct bucket_data {
        std::vector<int32_t> keys;   // batch sizes seen, ascending
        std::vector<double> ms;      // EMA cost per key
        std::vector<double> env;     // monotone envelope of eff (running max, or pooled), rebuilt on change
        std::vector<int32_t> count;  // observations per key
        std::vector<uint8_t> capped; // the first observation was capped (it may have paid a one-time cost)
        std::vector<uint8_t> steady; // learnt from steady runs (else from one-off runs only, or imported)
        std::vector<uint8_t> stale;  // imported from another session, not yet measured in a steady run here
        std::vector<uint8_t> dear;   // its last run was a stall's dearness, held back until the next run confirms it
        std::vector<std::vector<float>> recent;  // its latest steady runs, oldest first (at most RECENT_RUNS)
        std::vector<double> eff;     // ms, a one-off-only size held to the line of the steady sizes
        int32_t n_seen = 0;
    };
    bucket_data b_[N_BUCKETS];
    int32_t index_of(int32_t n_tokens, int32_t bucket) const;  // the size's place among this depth's sizes, -1: none
    double predict_in(const bucket_data & b, int32_t n_tokens) const;
    double predict_confirmed(const bucket_data & b, int32_t n_tokens) const;  // from sizes seen twice; 0: none
    // the nearest bucket with at least min_keys sizes (2: the curve predict() borrows for a bucket; -1: none)
    int32_t nearest(int32_t bucket, size_t min_keys) const;
    void rebuild(bucket_data & b) const;
};


// Decayed counts of position-wise acceptance.
struct hazard_counts {
    std::vector<double> acc;  // position i accepted
    std::vector<double> tri;  // position i tried (every earlier one accepted)
    void resize(int32_t n) { acc.assign(n, 0.0); tri.assign(n, 0.0); }
    void decay(double f);
    void add(int32_t n_drafted, int32_t n_accepted);
};

struct controller_params {
    int32_t n_max = 8;
    int32_t n_streams = 1;
    drafter_kind kind = DRAFTER_MODEL;
    bool adaptive = true;
    uint32_t seed = 1;
    std::vector<int32_t> schedule;  // not adaptive: a fixed cycle of draft lengths (empty: always n_max)
    int32_t kv_window = 256;        // the target's KV cache view grows in steps of this many cells (a graph serves one)
};

// a step llama can grow a KV cache's view in (patch 0012): a power of two from 256 to 65536 cells
bool valid_kv_window(int32_t cells);

struct step_obs {
    std::vector<int32_t> k, n_drafted, n_accepted, n_catchup, depth, active;
    std::vector<int32_t> source;  // per stream: 0 the drafter, 1 a free draft (an n-gram lookup beside a draft model)
    double t_draft_first_ms = 0.0;
    double t_draft_rest_ms = 0.0;
    int32_t n_draft_iters = 0;
    double t_draft_call_ms = 0.0;
    double t_target_ms = 0.0;
    double t_step_ms = 0.0;
};

struct controller_counters {
    std::vector<int64_t> k_hist;  // n_max + 1
    int64_t n_probes = 0;
    int64_t n_guard = 0;
    double est_plain_ms = 0.0;
};

class controller {
public:
    explicit controller(const controller_params & p);

    // caps[i]: the most stream i may draft now (context, n_predict); active[i] = 0 for streams not in the step.
    // pending[i]: tokens a detached draft model would have to catch up before drafting (DRAFTER_MODEL).
    // free_len[i] > 0: a draft of that length already exists for stream i at no cost (an n-gram lookup next to
    // a draft model); the stream then drafts from it, up to its length
    void choose(const std::vector<int32_t> & caps, const std::vector<int32_t> & depth, const std::vector<int32_t> & active,
                const std::vector<int32_t> & pending, std::vector<int32_t> & k_out,
                const std::vector<int32_t> & free_len = {});
    void observe(const step_obs & o);

    // forget acceptance history of a stream (a new prompt in it); costs stay
    void reset_stream(int32_t stream);

    // false when a lone stream at this depth could not gain from drafting even if every drafted token landed, by
    // costs measured here (then a draft model need not read a new prompt: it catches up if that ever changes)
    bool worth_drafting(int32_t depth) const;

    // the learnt costs, to seed a later session of the same models on the same machine; import keeps at most
    // two observations per size, so what this machine measures now soon outweighs them (a size seen once is
    // imported as seen once: its next run may still replace it)
    std::vector<cost_point> export_costs() const;
    void import_costs(const std::vector<cost_point> & pts);

    const controller_counters & counters() const { return counters_; }
    void reset_counters();

    // what it has learnt, for stats
    int32_t last_bucket() const { return last_bucket_; }
    double target_cost(int32_t n_tokens, int32_t bucket) const { return target_.predict(n_tokens, bucket); }
    double draft_first_ms(int32_t bucket) const { return draft_first_cost(1, bucket); }
    double draft_token_ms(int32_t bucket) const { return draft_rest_.predict(1, bucket); }
    double draft_call_ms() const { return draft_call_.predict(1, 0); }
    double catchup_token_ms(int32_t bucket) const;
    // a draft model's first decode of a step, of this many rows (one per stream drafting, plus what they catch up)
    double draft_first_cost(int32_t rows, int32_t bucket) const;
    // a draft model's further decode of this many rows; what a row adds to a lone stream's first decode in a run
    double draft_rest_cost(int32_t rows, int32_t bucket) const;
    double run_row_ms(int32_t bucket) const;
    double overhead_ms() const { return overhead_spec_; }
    double cold_ms() const { return cold_seen_ ? std::max(0.0, cold_ms_) : 0.0; }
    double plain_ms_per_token(int32_t bucket) const;
    std::vector<double> pooled_hazards() const;
    const std::vector<int32_t> & last_k() const { return last_k_; }
    const controller_params & params() const { return p_; }

    // how far behind a draft model may fall and still catch up: beyond, it restarts from this many recent tokens,
    // so that one catch-up costs at most ~16 plain steps
    int32_t catchup_limit(int32_t bucket) const;

private:
    struct stream_state {
        hazard_counts h_src[2];    // by source: the drafter, free drafts
        int32_t src = 0;           // source of this step's draft
        hazard_counts & h() { return h_src[src]; }
        const hazard_counts & h() const { return h_src[src]; }
        bool off = false;          // speculation judged not to pay: k = 0 but for probes
        int32_t gap = 0;           // steps until the next probe
        int32_t gap_len = 4;       // current probe interval
        bool probing = false;      // this step's draft is a probe
        int32_t owed_run = 0;      // probes in a row that followed one another to price drafting
        int32_t repeat_k = 0;      // the next probe repeats this draft length (its batch measured in a steady run)
        int32_t resume_gap = 0;    // a new prompt found the stream off: the steps left of its probe interval
        // where probes are dear (a GPU's: their batches' first runs in a KV window, a drafter's catch-up), what they
        // may still spend: PROBE_BUDGET of each plain step while off, less each probe's measured cost (a new prompt's
        // shorter schedule must not raise probing above the budget in long generations)
        double probe_credit = 0.0;
        bool hopeful = false;      // the last probe found drafting would pay at an acceptance a standard error better
        int32_t misses = 0;        // probes in a row, since it last drafted, that found drafting not even plausible
        int32_t probe_run = 0;     // probes in a row of a dear probe's run (its batch warm after the first)
        double run_ms = 0.0;       // what the further steps of the probe's run cost so far beyond plain decoding
        int32_t steps = 0;
        int32_t k_on = 0;          // the length it drafted at when it last drafted by choice (not a probe)
        double lead_ms = 0.0;      // what another length would have saved over the length held, lately (switch_lead)
        int32_t explore_k = 0;     // a try of a longer draft: its length, and the steps of the run left
        int32_t explore_left = 0;
        // ledger of this stream's speculative steps: its share of their time against plain decoding's
        std::vector<double> led_real, led_plain, led_tok;
        int32_t led_pos = 0;
    };

    // observe(), step by step: what the step adds up to; its costs; acceptance; the ledgers; probe outcomes
    struct step_totals;
    step_totals totals_of(const step_obs & o) const;
    void observe_costs(const step_obs & o, const step_totals & t);
    void observe_acceptance(const step_obs & o);
    void observe_ledgers(const step_obs & o, const step_totals & t);
    bool probe_pays(const step_obs & o, const step_totals & t, int32_t stream, double z = 0.0) const;
    void observe_probes(const step_obs & o, const step_totals & t);

    // choose(), step by step: what the step is; plain steps owed; how long a draft may be before drafting was priced;
    // probes of the streams that are off; the lengths that maximise tokens per ms; the streams' state after it
    struct step_view;
    step_view view_of(const std::vector<int32_t> & caps, const std::vector<int32_t> & depth,
                      const std::vector<int32_t> & active, const std::vector<int32_t> & free_len);
    bool calibrating(const step_view & v, const std::vector<int32_t> & active);
    int32_t explore_cap(const step_view & v);
    double plan_probes(const step_view & v, const std::vector<int32_t> & active, std::vector<int32_t> & k);
    // lone_rate: where one stream is in the step, its tokens per ms by draft length as the parts price them (0: not
    // a candidate) - what a try of a longer draft is judged by; lead: where a lone stream keeps the length it holds,
    // the best other length priced without the change to it
    struct lead_view {
        int32_t stream = -1;      // the lone stream (-1: none)
        int32_t held = -1;        // the length it keeps (-1: none, or it changes length this step)
        double held_rate = 0.0;   // its tokens per ms
        int32_t k = 0;            // the best other length (0: none) ...
        double rate = 0.0;        // ... its tokens per ms, the change to it left out
        double tokens = 0.0;      // ... and the tokens it is expected to commit in a step
        double change_ms = 0.0;   // what a change between lengths costs here, in full
    };
    std::vector<int32_t> best_lengths(const step_view & v, const std::vector<int32_t> & active,
                                      const std::vector<int32_t> & pending, std::vector<int32_t> k, double expect,
                                      int32_t explore_cap, std::vector<double> & lone_rate, lead_view & lead) const;
    // a lone stream that keeps its length while another leads it by less than HOLD_MARGIN leaves for that one once
    // what it would have saved pays the change
    void switch_lead(const lead_view & lead, std::vector<int32_t> & best);
    void follow_choice(const step_view & v, const std::vector<int32_t> & active, std::vector<int32_t> & best,
                       int32_t explore_cap, const std::vector<double> & lone_rate);

    double hazard(const stream_state & s, int32_t i) const;
    double hazard_hopeful(const stream_state & s, int32_t i, double z) const;
    double pooled(int32_t i, int32_t src = 0, const hazard_counts * except = nullptr) const;
    double predict_step(const std::vector<int32_t> & k, const std::vector<int32_t> & active,
                        const std::vector<int32_t> & pending, int32_t bucket,
                        const std::vector<int32_t> & free = {}) const;
    double plain_step_ms(int32_t n_active, int32_t bucket) const;
    // predict_step, and where one stream alone drafts from its drafter, corrected by what that length's whole step
    // measured against the parts' sum (whole_fix); parts: predict_step's own figure
    double predict_priced(const std::vector<int32_t> & k, const std::vector<int32_t> & active,
                          const std::vector<int32_t> & pending, int32_t bucket, const std::vector<int32_t> & free,
                          double * parts = nullptr) const;
    // a lone stream's draft of k: its whole step as measured in steady runs over the parts' sum predicted for it now
    // (at k's nearest measured length where k itself was not measured; 1 where none was)
    double whole_fix(int32_t stream, int32_t k, int32_t bucket) const;
    void ledger_add(stream_state & s, double realised_ms, double plain_ms, int32_t tokens);
    int32_t probe_gap_cap(int32_t stream, int32_t bucket, const std::vector<int32_t> & free) const;
    // the probe interval at which probes cost the stream's probe budget of plain decoding (a GPU's cold batches included)
    int32_t probe_gap_budget(int32_t stream, int32_t bucket) const;
    // the share of plain decoding a stream's probes may cost: PROBE_BUDGET, SPARSE_BUDGET after SPARSE_AFTER misses
    double probe_budget(int32_t stream) const;
    // a probe of this length may go on in a run (PROBE_RUN): its warm steps cost far less than its first did
    bool run_pays_evidence(int32_t stream, int32_t len, int32_t bucket) const;
    // the drafter call table's size for a step of n_drafting streams drafting k_sum tokens, the longest draft k_top:
    // an autoregressive drafter's tokens, a block drafter's blocks (one per stream, as long as the longest draft),
    // else its calls
    int32_t call_size(int32_t n_drafting, int32_t k_sum, int32_t k_top) const;
    // a change of batch size is dear here: its cold run costs a good share of a plain step (a GPU's graphs); on a CPU
    // it is not, and the choice ignores it
    bool cold_dear(int32_t bucket) const;
    // a probe is dear here: a change of batch size is (cold_dear), or a size's first runs in a window are (a new
    // prompt then keeps its stream's probe schedule)
    bool probes_dear(int32_t bucket) const;
    bool first_runs_dear(int32_t bucket) const;  // a size's first runs in a KV window cost a good share of a plain step
    bool once_is_enough(int32_t bucket) const;  // a one-off run is as good as a steady one here (cold runs cheap)
    // a probe's draft length: PROBE_K to learn acceptance, longer where the best case (every token landing) rests
    // on a batch size never measured twice here (then that size is what to measure; only for a stream alone in
    // its step, whose probe batch is that size), 0 where even the best case cannot pay by measured costs
    int32_t probe_len(int32_t stream, int32_t cap, int32_t bucket, const std::vector<int32_t> & free, bool alone) const;
    // a draft model's steady cost (a draft right after a draft: little to catch up) not yet measured twice here
    bool drafting_owed(int32_t bucket) const;

    controller_params p_;
    std::vector<stream_state> s_;
    hazard_counts pool_[2];
    cost_table target_;       // target batch (+ process of hidden-state drafters), by tokens
    cost_table draft_first_;  // draft model: first decode of a step, by tokens in it (catch-up + one per stream)
    cost_table draft_rest_;   // draft model: each further decode, by streams still drafting
    cost_table draft_call_;   // upstream drafter call, by streams drafting (bucket 0)
    // a lone stream's whole step by its draft length (n_tokens = k), learnt from steady runs only: what the sum of the
    // parts misses - a GPU's kernels are not linear in the batch size, nor a draft model's decodes in their count
    // (the 7B pair on an H200: its second decode of a step costs 1.7 ms, its third and fourth 1.2 together)
    struct whole_cost {
        double ms = 0.0;
        int32_t count = 0;
        bool imported = false;  // from another session: judged by at once, outweighed as this one measures
    };
    std::vector<whole_cost> whole_[cost_table::N_BUCKETS];  // by k (0 unused)
    const whole_cost * whole_at(int32_t k, int32_t bucket) const;  // nullptr: not measured often enough to judge by
    int32_t k_prev_[2] = { -1, -1 };  // a lone stream's draft length in the last two steps (-1: none, or not alone)
    double overhead_spec_ = 0.0, overhead_plain_ = 0.0;
    bool overhead_seen_spec_ = false, overhead_seen_plain_ = false;
    // a target batch of a size that did not run in the two steps before costs more than in a steady run (on a
    // GPU its graph runs eagerly or is captured): learnt apart, or a short draft between plain steps would look
    // dear for good
    double cold_ms_ = 0.0;
    bool cold_seen_ = false;
    // a batch's graph is built for the KV cache's window (llama pads its view to 256 cells): in a window a size's
    // first two runs cost more than the cold runs above (on a GPU its graph is built and run eagerly, then captured),
    // and a change between sizes that ran there twice costs only a cold run. Learnt apart, and a size that still owes
    // them is priced by them, spread over the steps left in the window
    struct size_runs {
        int32_t window = -1;
        int32_t runs = 0;  // in that window, at most 2
    };
    std::vector<size_runs> size_runs_;   // by target batch size
    // and by a draft model's batch size (a step's first decode: catch-up + 1 rows; its further decodes: one row a
    // stream) or a block drafter's call size, whose graphs are built and captured the same way
    std::vector<size_runs> draft_runs_;
    // the runs of size n_tok in `window` before this one (0, 1 or 2: twice or more), this one counted in `runs`
    static int32_t note_run(std::vector<size_runs> & runs, int32_t n_tok, int32_t window);
    double first_ms_[2] = { 0.0, 0.0 };  // a size's first and second run in a window, beyond its steady cost
    bool first_seen_[2] = { false, false };
    // what a lone stream's probe step cost beyond a plain step, as measured (its batch's first runs in a new window, a
    // drafter's catch-up of the features it skipped, its call), by depth bucket; a draft model's catch-up aside, which
    // the schedule prices by the gap. Its prediction from steady costs misses most of it on a GPU
    double probe_excess_[cost_table::N_BUCKETS] = {};
    int32_t probe_seen_[cost_table::N_BUCKETS] = {};
    // and what the further steps of a probe's run cost beyond plain decoding of what they committed, a probe's mean
    // (one without a run counts nothing): part of a probe's cost, which the schedule spends the budget on. Left out,
    // the 27B + DFlash2 at p 0.3 on an H100 probed every ~64 steps with runs of ~4 more, each step 2 ms over what it
    // committed: 3.0% of plain's time on probes against a budget of 2%
    double probe_run_ms_[cost_table::N_BUCKETS] = {};
    double probe_fixed_ms(double predicted, int32_t bucket) const;
    // a lone stream's probe at PROBE_K beyond plain decoding, whole: its step, the cold plain step after it, its run
    double probe_whole_ms(int32_t stream, int32_t bucket, const std::vector<int32_t> & free) const;
    int32_t window_of(int32_t cells, int32_t n_tok) const;  // cells: the KV cells in use before the batch
    int32_t runs_in_window(int32_t n_tok, int32_t window) const;
    // what the runs a size still owes in the window of a batch after `cells` cost, per step over the steps left in
    // the window at `per_step` tokens a step
    double first_runs_ms(int32_t n_tok, int32_t cells, double per_step) const;
    int32_t tok_prev_[2] = { 0, 0 };  // the target batch sizes of the last two steps (0: none, or a prompt's)
    int32_t call_prev_ = 0;           // the drafter's call size in the last step (0: none, or a prompt's step)
    std::vector<int32_t> last_k_;
    int32_t last_bucket_ = 0;
    int32_t steps_ = 0;
    uint64_t chosen_ = 0;            // choose() calls (a schedule's position)
    int32_t since_plain_ = 0;        // steps since the last plain step (to refresh the plain cost)
    bool refreshed_ = false;         // the plain steps just run were a refresh's, while streams drafted
    int32_t plain_owed_ = 0;         // plain steps to run first (after the ledger stopped drafting, or to refresh)
    std::mt19937 rng_;
    controller_counters counters_;
};

}  // namespace pls
