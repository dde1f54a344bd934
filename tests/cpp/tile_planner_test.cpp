// The tiling planner (src/tile/tile_planner.h): properties of its plans over many random shapes
// and cache models, pinned tiles (honoured exactly, results against the reference interpreter
// with tails on every side; diagnostics when they cannot fit), and one kernel compiled for a
// symbolic dimension planned anew for each size it runs on.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/tile_kernel.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"
#include "tile/lower.h"
#include "tile/tile_planner.h"

namespace pto {
namespace {

CacheModel cache(size_t l1d, size_t l2, size_t l3) {
  CacheModel c;
  c.l1d = l1d;
  c.l2 = l2;
  c.l3 = l3;
  return c;
}

TileFacts facts(int regs, int inputs, int outputs, bool reduction, bool bool_io = false) {
  TileProgram p;
  p.num_regs = regs;
  for (int k = 0; k < inputs; ++k)
    p.inputs.push_back(
        {kNoValue, cat("x", k), bool_io && k == 0 ? TileDType::kBool : TileDType::kF32, {}});
  for (int k = 0; k < outputs; ++k)
    p.outputs.push_back(
        {kNoValue, cat("y", k), bool_io && k == 0 ? TileDType::kBool : TileDType::kF32, {}});
  if (reduction) p.code.push_back({.op = TileOpcode::kRowReduce});
  return TileFacts::of(p, "kernel 'test'");
}

// Every value of the space lies in exactly one tile, and every tile's valid region is inside
// its capacity shape; tiles are laid out as the plan says (row groups, then blocks, then
// columns), derived here independently of the executor.
void expect_exact_cover(const TilePlan& p, const std::string& what) {
  const TileSpace& s = p.space;
  const int64_t groups = s.rows / s.row_group;
  ASSERT_EQ(p.row_tiles % groups, 0) << what;
  const int64_t blocks = p.row_tiles / groups;
  // Rows: the blocks of each group cover it once.
  EXPECT_GE(blocks * p.tile.rows, s.row_group) << what;
  EXPECT_LT((blocks - 1) * p.tile.rows, s.row_group) << what;
  EXPECT_GE(p.col_tiles * p.tile.cols, s.cols) << what;
  EXPECT_LT((p.col_tiles - 1) * p.tile.cols, s.cols) << what;
  EXPECT_EQ(p.tail.rows, s.row_group - (blocks - 1) * p.tile.rows) << what;
  EXPECT_EQ(p.tail.cols, s.cols - (p.col_tiles - 1) * p.tile.cols) << what;
  EXPECT_GE(p.tail.rows, 1) << what;
  EXPECT_GE(p.tail.cols, 1) << what;
  if (s.rows * s.cols > 200000)
    return;  // the arithmetic above suffices; mark small ones cell by cell
  std::vector<int> seen(static_cast<size_t>(s.rows * s.cols), 0);
  for (int64_t t = 0; t < p.tiles; ++t) {
    const int64_t rt = t / p.col_tiles, ct = t % p.col_tiles;
    const int64_t g = rt / blocks, b = rt % blocks;
    const int64_t r0 = g * s.row_group + b * p.tile.rows, c0 = ct * p.tile.cols;
    const int64_t r1 = std::min(r0 + p.tile.rows, (g + 1) * s.row_group);
    const int64_t c1 = std::min(c0 + p.tile.cols, s.cols);
    ASSERT_LE((r1 - r0) * (c1 - c0), p.capacity) << what;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) ++seen[static_cast<size_t>(r * s.cols + c)];
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << what << " value " << i;
}

TEST(TilePlanner, PropertiesOverRandomShapesAndCaches) {
  const CacheModel caches[] = {
      cache(8 << 10, 128 << 10, 128 << 10), cache(32 << 10, 1 << 20, 16 << 20),
      cache(48 << 10, 2 << 20, 4 << 20), cache(1 << 20, 4 << 20, 16 << 20)};
  const int64_t specials[] = {1,   2,   3,    7,    13,   16,    17,      97,      255,    256,
                              257, 768, 1000, 4093, 4096, 65521, 1 << 20, 1000003, 1 << 24};
  std::mt19937_64 rng(42);
  auto pick = [&](int64_t limit) {
    if (rng() % 2) return specials[rng() % std::size(specials)] % limit + 1;
    return static_cast<int64_t>(rng() % static_cast<uint64_t>(limit)) + 1;
  };
  int checked = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const CacheModel& cm = caches[iter % std::size(caches)];
    const bool reduction = rng() % 3 == 0;
    const TileFacts f = facts(1 + static_cast<int>(rng() % 24), 1 + static_cast<int>(rng() % 4),
                              1 + static_cast<int>(rng() % 2), reduction, rng() % 5 == 0);
    TileSpace s;
    s.cols = pick(1 << 24);
    s.row_group = pick(rng() % 2 ? 64 : 1 << 20);
    s.rows = s.row_group * pick(std::max<int64_t>(1, (1 << 26) / (s.cols * s.row_group)));
    const int threads = 1 + static_cast<int>(rng() % 8);
    const TilePlan p = plan_tiles(f, s, cm, threads);
    const std::string what =
        cat("space ", s.rows, "x", s.cols, "/", s.row_group, " l1d ", cm.l1d, " regs+io ",
            f.buffers.size(), reduction ? " reducing" : "", ": ", p.str());
    expect_exact_cover(p, what);
    EXPECT_FALSE(p.pinned);
    EXPECT_GE(p.capacity, p.tile.rows * p.tile.cols) << what;
    EXPECT_EQ(p.capacity % 16, 0) << what;
    EXPECT_EQ(p.working_set, static_cast<size_t>(p.capacity) * f.bytes_per_value()) << what;
    // The working set fits its level's budget, and that level is the smallest that holds it.
    if (p.level != CacheLevel::kMemory) {
      EXPECT_LE(p.working_set, p.budget) << what;
    }
    if (p.level != CacheLevel::kL1) {
      EXPECT_GT(p.working_set, level_budget(cm, CacheLevel::kL1)) << what;
    }
    // Rows are cut only by programs that do not reduce them; a program small enough for the
    // smallest tile always gets an L1 plan unless it must hold long rows whole.
    if (reduction) {
      EXPECT_EQ(p.tile.cols, s.cols) << what;
    }
    const bool small_program =
        kMinCapacity * f.bytes_per_value() <= level_budget(cm, CacheLevel::kL1);
    const bool long_rows = reduction && (s.cols + 15) / 16 * 16 > planned_capacity(f, cm);
    if (small_program && !long_rows) {
      EXPECT_EQ(p.level, CacheLevel::kL1) << what;
    }
    // Tasks: tiny kernels (fewer values than two parallel chunks) and one thread run whole.
    EXPECT_GE(p.tasks, 1);
    EXPECT_LE(p.tasks, threads);
    EXPECT_EQ(p.whole, p.tasks == 1);
    if (s.rows * s.cols < 2 * kGrainValues || threads == 1 || p.tiles == 1) {
      EXPECT_TRUE(p.whole) << what;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
}

TEST(TilePlanner, TinyTensorsAreOneTileRunWhole) {
  const TileFacts f = facts(3, 1, 1, false);
  const TilePlan p = plan_tiles(f, {1, 100, 1}, cache(32 << 10, 1 << 20, 16 << 20), 8);
  EXPECT_EQ(p.tiles, 1);
  EXPECT_TRUE(p.whole);
  EXPECT_EQ(p.tile, (TileShape{1, 100}));
  EXPECT_NE(p.str().find("runs whole"), std::string::npos) << p.str();
}

TEST(TilePlanner, LongRowsOfAReductionLeaveL1) {
  const CacheModel cm = cache(32 << 10, 1 << 20, 16 << 20);
  const TilePlan p = plan_tiles(facts(3, 1, 1, true), {1, 1 << 17, 1}, cm, 2);
  EXPECT_EQ(p.tile, (TileShape{1, 1 << 17}));
  EXPECT_EQ(p.level, CacheLevel::kL3) << p.str();  // 5 buffers x 512 KiB: above L2, within L3
  const TilePlan q2 = plan_tiles(facts(3, 1, 1, true), {1, 1 << 20, 1}, cm, 2);
  EXPECT_EQ(q2.level, CacheLevel::kMemory) << q2.str();  // 20 MiB
  const TilePlan q = plan_tiles(facts(3, 1, 1, true), {1024, 768, 1024}, cm, 2);
  EXPECT_EQ(q.tile, (TileShape{1, 768})) << q.str();
  EXPECT_EQ(q.level, CacheLevel::kL1) << q.str();
}

TEST(TilePlanner, PinnedShapeIsHonouredExactly) {
  const CacheModel cm = cache(32 << 10, 1 << 20, 16 << 20);
  const TileFacts f = facts(2, 1, 1, false);
  const TileShape t = check_pinned_tile(f, {5, 96}, cm);
  const TilePlan p = plan_tiles(f, {37 * 3, 1000, 37}, cm, 2, t);
  EXPECT_TRUE(p.pinned);
  EXPECT_EQ(p.tile, (TileShape{5, 96}));
  EXPECT_EQ(p.tail, (TileShape{2, 40}));
  expect_exact_cover(p, p.str());
  EXPECT_EQ(check_pinned_tile(f, {512}, cm), (TileShape{1, 512}));
}

TEST(TilePlanner, PinnedTooLargeNamesBufferNeededAndAvailable) {
  const CacheModel cm = cache(32 << 10, 1 << 20, 16 << 20);
  const TileFacts f = facts(3, 2, 1, false);
  try {
    check_pinned_tile(f, {64, 256}, cm);  // 16384 values x 4 B: one register is 64 KiB
    FAIL() << "no error";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("kernel 'test'"), std::string::npos) << m;
    EXPECT_NE(m.find("64x256"), std::string::npos) << m;
    EXPECT_NE(m.find("register r0"), std::string::npos) << m;
    EXPECT_NE(m.find("65536 bytes"), std::string::npos) << m;  // needed
    EXPECT_NE(m.find("32768 bytes available"), std::string::npos) << m;
  }
  try {                                   // the registers fit; the second input does not
    check_pinned_tile(f, {1, 1664}, cm);  // 6 buffers of 6656 bytes
    FAIL() << "no error";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("input %1 'x1' (6656 bytes)"), std::string::npos) << m;
    EXPECT_NE(m.find("to 33280 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("of 32768 bytes available"), std::string::npos) << m;
  }
  for (const std::vector<int64_t>& bad :
       std::vector<std::vector<int64_t>>{{}, {0, 16}, {4, -1}, {1, 2, 3}, {1LL << 40, 1LL << 40}})
    EXPECT_THROW(check_pinned_tile(f, bad, cm), ValueError) << dims_str(bad);
  // A reduction needs whole rows.
  const TileFacts r = facts(2, 1, 1, true);
  try {
    plan_tiles(r, {8, 100, 8}, cm, 1, TileShape{2, 64});
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("whole rows"), std::string::npos) << e.what();
  }
}

// ---- through compile(): pinned tiles against the reference interpreter ----

// y = sigmoid(x * s + b) - x, x [d0, d1, n], s [d1, 1], b [n]: inputs broadcast along rows and
// along columns, so tiles of several rows gather; three merged dimensions, so row groups.
Graph bias_graph(const Shape& x_shape) {
  Graph g;
  const Dim n = x_shape.back(), d1 = x_shape[x_shape.size() - 2];
  ValueId x = g.add_input("x", {DType::kF32, x_shape});
  ValueId s = g.add_input("s", {DType::kF32, Shape{d1, Dim(1)}});
  ValueId b = g.add_input("b", {DType::kF32, Shape{n}});
  ValueId m = g.add_value("m"), a = g.add_value("a"), z = g.add_value("z"), y = g.add_value("y");
  g.add_node("Mul", {x, s}, {m}, {}, "mul");
  g.add_node("Add", {m, b}, {a}, {}, "add");
  g.add_node("Sigmoid", {a}, {z}, {}, "sig");
  g.add_node("Sub", {z, x}, {y}, {}, "y");
  g.add_output(y);
  return g;
}

Tensor random_f32(const Dims& shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    const float a = got.data<float>()[i], b = want.data<float>()[i];
    if (std::fabs(a - b) <= 1e-5f * (1.0f + std::fabs(b))) continue;
    ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected " << b;
    ++bad;
  }
}

TEST(TilePlanner, PinnedTilesGiveTheReferenceResultsWithTails) {
  const Dims shape = {3, 37, 1000};  // row groups of 37 rows of 1000
  Graph g = bias_graph(Shape{3, 37, 1000});
  std::vector<Tensor> feeds = {random_f32(shape, 1), random_f32({37, 1}, 2), random_f32({1000}, 3)};
  const std::vector<Tensor> want = reference::run(g, feeds);
  const int saved = num_threads();
  for (const std::vector<int64_t>& tile : std::vector<std::vector<int64_t>>{
           {5, 96}, {1, 33}, {37, 8}, {40, 7}, {1, 1}, {1, 512}, {2, 256}, {100}}) {
    CompileOptions o;
    o.tiles["*"] = tile;
    Executable exe = compile(g, o);
    ASSERT_EQ(exe.num_steps(), 1u);
    const std::string d = exe.describe_step(0);
    const TileShape t = tile.size() == 1 ? TileShape{1, tile[0]} : TileShape{tile[0], tile[1]};
    EXPECT_NE(d.find(cat("of ", t.str(), " (pinned)")), std::string::npos) << d;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      expect_close(exe.run(feeds)[0], want[0], cat("tile ", t.str(), " x", threads));
    }
  }
  set_num_threads(saved);
}

TEST(TilePlanner, PinnedTileOfASoftmaxAndOfOneNode) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{10, 50}});
  ValueId h = g.add_value("h"), y = g.add_value("y"), e = g.add_value("e");
  ValueId c = g.add_value("c");
  g.set_initializer(c, Tensor::scalar(0.5f));
  g.add_node("Mul", {x, c}, {h}, {}, "scale");
  g.add_node("Softmax", {h}, {y}, {}, "softmax");
  g.add_node("Exp", {y}, {e}, {}, "exp");  // read outside: the softmax group ends at y
  g.add_output(y);
  g.add_output(e);
  std::vector<Tensor> feeds = {random_f32({10, 50}, 4)};
  const std::vector<Tensor> want = reference::run(g, feeds);
  CompileOptions o;
  o.tiles["*"] = {3, 64};
  o.tiles["y"] = {4, 50};  // a kernel by its output: wins over "*"
  Executable exe = compile(g, o);
  std::string dump;
  for (size_t i = 0; i < exe.num_steps(); ++i) dump += exe.describe_step(i);
  EXPECT_NE(dump.find("of 4x50 (pinned)"), std::string::npos) << dump;
  const std::vector<Tensor> got = exe.run(feeds);
  expect_close(got[0], want[0], "softmax 4x50");
  expect_close(got[1], want[1], "exp 3x64");

  o.tiles = {{"*", {3, 32}}};  // narrower than the rows the softmax reduces: at compile time
  try {
    compile(g, o);
    FAIL() << "no error";
  } catch (const ValueError& err) {
    EXPECT_NE(std::string(err.what()).find("whole rows"), std::string::npos) << err.what();
  }
}

TEST(TilePlanner, CompileRejectsPinsThatCannotApply) {
  Graph g = bias_graph(Shape{4, 8, 64});
  auto message = [&](std::map<std::string, std::vector<int64_t>> tiles) {
    CompileOptions o;
    o.tiles = std::move(tiles);
    try {
      compile(g, o);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message({{"nope", {4, 64}}});
  EXPECT_NE(m.find("'nope'"), std::string::npos) << m;
  EXPECT_NE(m.find("'y'"), std::string::npos) << m;  // lists the tile kernels
  m = message({{"*", {0, 64}}});
  EXPECT_NE(m.find("positive"), std::string::npos) << m;
  m = message({{"sig", {1, 2, 3}}});
  EXPECT_NE(m.find("(rows, cols)"), std::string::npos) << m;
  m = message({{"add", {256, 256}}});  // a kernel by one of its nodes
  EXPECT_NE(m.find("kernel 'y'"), std::string::npos) << m;
  EXPECT_NE(m.find("register r0"), std::string::npos) << m;
  EXPECT_NE(m.find("bytes available"), std::string::npos) << m;
  CompileOptions o;
  o.level = 1;  // no fusion: single nodes; a pinned one runs as a tile program
  o.tiles["sig"] = {2, 16};
  Executable exe = compile(g, o);
  bool pinned = false;
  for (size_t i = 0; i < exe.num_steps(); ++i)
    pinned |= exe.describe_step(i).find("of 2x16 (pinned)") != std::string::npos;
  EXPECT_TRUE(pinned);
  std::vector<Tensor> feeds = {random_f32({4, 8, 64}, 5), random_f32({8, 1}, 6),
                               random_f32({64}, 7)};
  expect_close(exe.run(feeds)[0], reference::run(g, feeds)[0], "level 1, sigmoid pinned");
}

TEST(TilePlanner, PinnedTileWithABooleanOutput) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{7, 50}});
  ValueId b = g.add_input("b", {DType::kF32, Shape{50}});
  ValueId e = g.add_value("e"), y = g.add_value("y");
  g.add_node("Exp", {x}, {e}, {}, "exp");
  g.add_node("Greater", {e, b}, {y}, {}, "gt");
  g.add_output(y);
  std::vector<Tensor> feeds = {random_f32({7, 50}, 11), random_f32({50}, 12)};
  const Tensor want = reference::run(g, feeds)[0];
  for (const std::vector<int64_t>& tile :
       std::vector<std::vector<int64_t>>{{3, 20}, {1, 7}, {8, 64}}) {
    CompileOptions o;
    o.tiles["*"] = tile;
    const Tensor got = compile(g, o).run(feeds)[0];
    ASSERT_EQ(got.dtype(), DType::kBool);
    for (int64_t i = 0; i < got.numel(); ++i)
      ASSERT_EQ(got.data<bool>()[i], want.data<bool>()[i])
          << dims_str(Dims(tile.begin(), tile.end())) << " at " << i;
  }
}

// ---- symbolic dimensions: one kernel, a plan per size ----

TEST(TilePlanner, SymbolicDimsArePlannedPerRun) {
  Graph h;
  ValueId x = h.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), Dim(768)}});
  ValueId b = h.add_input("b", {DType::kF32, Shape{768}});
  ValueId a = h.add_value("a"), y = h.add_value("y");
  h.add_node("Add", {x, b}, {a}, {}, "add");
  h.add_node("Tanh", {a}, {y}, {}, "tanh");
  h.add_output(y);
  infer_types(h);
  KernelGroup group;
  group.nodes = {0, 1};
  finish_group(h, group);
  std::optional<TileProgram> prog = lower_elementwise(h, group);
  ASSERT_TRUE(prog);
  cpu::TileKernel kernel(*prog);
  EXPECT_NE(kernel.describe().find("planned per run"), std::string::npos) << kernel.describe();
  Executable exe = compile(h);
  std::vector<std::string> plans;
  for (int64_t batch : {2, 4096}) {
    std::vector<Tensor> feeds = {random_f32({batch, 768}, 8), random_f32({768}, 9)};
    expect_close(exe.run(feeds)[0], reference::run(h, feeds)[0], cat("batch ", batch));
    plans.push_back(kernel.plan({batch, 768}, {{batch, 768}, {768}}).str());
  }
  EXPECT_NE(plans[0], plans[1]);
  const TilePlan small = kernel.plan({2, 768}, {{2, 768}, {768}});
  const TilePlan large = kernel.plan({4096, 768}, {{4096, 768}, {768}});
  EXPECT_TRUE(small.whole);
  EXPECT_LT(small.tiles, large.tiles);
}

}  // namespace
}  // namespace pto
