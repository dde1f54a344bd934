// FuseChannelMoves and GatherChannels: chains of movement nodes that only move channel planes
// become GatherChannels nodes (and nothing else does), every rewritten graph gives the original's
// results on the reference interpreter, and the CPU kernel (NCHW and blocked, every ISA, 1 and 2
// threads) gives the reference kernel's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/isa/isa.h"
#include "passes/assign_layouts.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/passes.h"
#include "pto/reference.h"
#include "random_tensor.h"

namespace pto {
namespace {

using testing::random_tensor;

std::vector<Tensor> random_inputs(const Graph& g, uint32_t seed) {
  std::vector<Tensor> in;
  for (ValueId v : g.inputs()) in.push_back(random_tensor(to_dims(*g.value(v).type.shape), seed++));
  return in;
}

// The float constants the text form left without data (zeros) get random values, seeds from
// `seed` on: weights the passes reorder or fold are then not trivially zero.
void randomize_weights(Graph& g, uint32_t seed) {
  std::vector<ValueId> floats;  // in value order, so each weight always gets the same seed
  for (const auto& [v, t] : g.initializers())
    if (t.dtype() == DType::kF32) floats.push_back(v);
  std::sort(floats.begin(), floats.end());
  for (ValueId v : floats) g.set_initializer(v, random_tensor(g.initializer(v)->shape(), seed++));
}

int count_ops(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

Graph fuse(const Graph& g) {
  Graph out = run_passes(g, {.level = 1, .only = {"FuseChannelMoves", "EliminateDeadCode"}});
  verify(out);
  return out;
}

// Bit for bit: the pass moves elements, it computes nothing.
void expect_same_bits(const Graph& before, const Graph& after) {
  const std::vector<Tensor> in = random_inputs(before, 7);
  const std::vector<Tensor> a = reference::run(before, in), b = reference::run(after, in);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].shape(), b[i].shape()) << "output " << i;
    EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << "output " << i;
  }
}

// torchvision's ShuffleNetV2 unit between two convs: the concat of the kept half and the branch,
// the shuffle (Reshape to [N, 2, C/2, H, W], Transpose, Reshape back), and the chunk of the next
// unit (two Slices).
const char* kShuffleUnit = R"(graph g (opset 18)
  input  %x1: f32[2, 24, 5, 7]
  input  %x2: f32[2, 24, 5, 7]
  const  %s5: i64[5] = [2, 2, 24, 5, 7]
  const  %s4: i64[4] = [2, 48, 5, 7]
  const  %ax: i64[1] = [1]
  const  %z: i64[1] = [0]
  const  %h: i64[1] = [24]
  const  %e: i64[1] = [48]
  %c = Concat(%x1, %x2) {axis=1}
  %r = Reshape(%c, %s5)
  %t = Transpose(%r) {perm=[0, 2, 1, 3, 4]}
  %u = Reshape(%t, %s4)
  %a = Slice(%u, %z, %h, %ax)
  %b = Slice(%u, %h, %e, %ax)
  %ra = Relu(%a)
  %rb = Sigmoid(%b)
  return %ra, %rb
)";

TEST(ChannelMoves, ShuffleAndChunkBecomeOneGatherPerHalf) {
  const Graph g = parse_graph(kShuffleUnit);
  const Graph f = fuse(g);
  EXPECT_EQ(count_ops(f, "GatherChannels"), 2) << print(f);
  for (const char* op : {"Concat", "Reshape", "Transpose", "Slice"})
    EXPECT_EQ(count_ops(f, op), 0) << op << "\n" << print(f);
  // The first half interleaves the first halves of x1 and x2: channels 0, 0, 1, 1, ...
  for (const Node& n : f.nodes())
    if (n.op == "GatherChannels" && n.outputs[0] == *f.find_value("a")) {
      const Dims index = n.attrs.get_ints("input_index"), ch = n.attrs.get_ints("input_channel");
      ASSERT_EQ(index.size(), 24u);
      for (int64_t j = 0; j < 24; ++j) {
        EXPECT_EQ(f.value(n.inputs[static_cast<size_t>(index[j])]).name, j % 2 ? "x2" : "x1");
        EXPECT_EQ(ch[j], j / 2);
      }
    }
  expect_same_bits(g, f);
}

// Concat then Slice (GhostNet's cat([x1, x2])[:, :oup]), a Split's part of a Concat, and a Gather
// of constant channel indices: each one gather.
TEST(ChannelMoves, ConcatSliceSplitAndGatherChains) {
  const Graph g = parse_graph(R"(graph g (opset 18)
  input  %x: f32[1, 10, 4, 4]
  input  %y: f32[1, 6, 4, 4]
  const  %ax: i64[1] = [1]
  const  %z: i64[1] = [0]
  const  %n: i64[1] = [13]
  const  %parts: i64[2] = [7, 9]
  const  %idx: i64[3] = [15, 0, 3]
  %c = Concat(%x, %y) {axis=1}
  %s = Slice(%c, %z, %n, %ax)
  %p, %q = Split(%c, %parts) {axis=1}
  %k = Gather(%c, %idx) {axis=1}
  %o1 = Relu(%s)
  %o2 = Relu(%q)
  %o3 = Relu(%k)
  return %o1, %o2, %o3
)");
  const Graph f = fuse(g);
  EXPECT_EQ(count_ops(f, "GatherChannels"), 3) << print(f);
  EXPECT_EQ(count_ops(f, "Concat") + count_ops(f, "Split") + count_ops(f, "Gather"), 0);
  expect_same_bits(g, f);
}

// What is not a choice of whole channel planes stays: a Transpose that moves H (Swin's roll is
// along axis 1 of NHWC, which is a plane choice; NCHW -> NHWC is not), a single Slice (one copy
// already), a chain on a dynamic batch, and one whose result is only read by more movement that
// leaves 4-D.
TEST(ChannelMoves, LeavesWhatIsNotAChannelGather) {
  const Graph spatial = parse_graph(R"(graph g (opset 18)
  input  %x: f32[1, 4, 6, 6]
  input  %y: f32[1, 4, 6, 6]
  %c = Concat(%x, %y) {axis=1}
  %t = Transpose(%c) {perm=[0, 1, 3, 2]}
  %o = Relu(%t)
  return %o
)");
  EXPECT_EQ(count_ops(fuse(spatial), "GatherChannels"), 0);
  const Graph single = parse_graph(R"(graph g (opset 18)
  input  %x: f32[1, 8, 3, 3]
  const  %ax: i64[1] = [1]
  const  %z: i64[1] = [2]
  const  %n: i64[1] = [6]
  %s = Slice(%x, %z, %n, %ax)
  %o = Relu(%s)
  return %o
)");
  EXPECT_EQ(count_ops(fuse(single), "GatherChannels"), 0);
  const Graph unknown_plane = parse_graph(R"(graph g (opset 18)
  input  %x: f32[1, 4, H, 3]
  input  %y: f32[1, 4, H, 3]
  const  %ax: i64[1] = [1]
  const  %z: i64[1] = [2]
  const  %n: i64[1] = [6]
  %c = Concat(%x, %y) {axis=1}
  %s = Slice(%c, %z, %n, %ax)
  %o = Relu(%s)
  return %o
)");
  EXPECT_EQ(count_ops(fuse(unknown_plane), "GatherChannels"), 0);
  // On a dynamic batch a chain must leave the batch alone: a Slice of images is not a gather.
  const Graph batch_slice = parse_graph(R"(graph g (opset 18)
  input  %x: f32[N, 4, 3, 3]
  input  %y: f32[N, 4, 3, 3]
  const  %ax: i64[2] = [0, 1]
  const  %z: i64[2] = [0, 2]
  const  %n: i64[2] = [9223372036854775807, 6]
  %c = Concat(%x, %y) {axis=1}
  %s = Slice(%c, %z, %n, %ax)
  %o = Relu(%s)
  return %o
)");
  EXPECT_EQ(count_ops(fuse(batch_slice), "GatherChannels"), 0) << print(fuse(batch_slice));
  const Graph flat = parse_graph(R"(graph g (opset 18)
  input  %x: f32[2, 4, 3, 3]
  input  %y: f32[2, 4, 3, 3]
  const  %s2: i64[2] = [2, 72]
  %c = Concat(%x, %y) {axis=1}
  %r = Reshape(%c, %s2)
  %o = Relu(%r)
  return %o
)");
  EXPECT_EQ(count_ops(fuse(flat), "GatherChannels"), 0);
}

// A dynamic batch, as pypto.optimize exports it (Reshape shapes with -1 for the batch): the chain
// leaves the batch alone, so it is evaluated for one image and the gather holds for any batch.
TEST(ChannelMoves, DynamicBatchShuffleIsAGather) {
  std::string text = kShuffleUnit;
  for (size_t p; (p = text.find("[2, ")) != std::string::npos;) text.replace(p, 4, "[N, ");
  for (size_t p; (p = text.find("= [N, ")) != std::string::npos;) text.replace(p, 6, "= [-1, ");
  const Graph g = parse_graph(text);
  ASSERT_EQ(print(g).find("= [N"), std::string::npos) << text;
  const Graph f = fuse(g);
  EXPECT_EQ(count_ops(f, "GatherChannels"), 2) << print(f);
  for (int64_t n : {1, 3}) {
    const std::vector<Tensor> in = {random_tensor({n, 24, 5, 7}, 2),
                                    random_tensor({n, 24, 5, 7}, 3)};
    const std::vector<Tensor> a = reference::run(g, in), b = reference::run(f, in);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].shape(), b[i].shape());
      EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << n;
    }
  }
}

// A chain that gives back one source as it is (split in two and concatenated in order) is that
// source: no node at all.
TEST(ChannelMoves, ChainEqualToItsSourceIsRemoved) {
  const Graph g = parse_graph(R"(graph g (opset 18)
  input  %x: f32[1, 8, 3, 3]
  const  %parts: i64[2] = [3, 5]
  %p, %q = Split(%x, %parts) {axis=1}
  %c = Concat(%p, %q) {axis=1}
  %o = Relu(%c)
  return %o
)");
  const Graph f = fuse(g);
  EXPECT_EQ(f.nodes().size(), 1u) << print(f);
  EXPECT_EQ(f.value(f.nodes()[0].inputs[0]).name, "x");
  expect_same_bits(g, f);
}

TEST(ChannelMoves, IsInTheLevel1Pipeline) {
  const Graph g = parse_graph(kShuffleUnit);
  for (int level : {1, 2, 3}) {
    const Graph f = run_passes(g, {.level = level});
    EXPECT_EQ(count_ops(f, "GatherChannels"), 2) << "level " << level;
  }
  EXPECT_EQ(count_ops(run_passes(g, {.level = 0}), "GatherChannels"), 0);
}

// A blocked region around the shuffle (convs before and after, as in ShuffleNet's later stages):
// AssignLayouts keeps GatherChannels blocked, with no reorder between the convs.
TEST(ChannelMoves, GatherStaysBlockedBetweenBlockedConvs) {
  Graph g = parse_graph(R"(graph g (opset 18)
  input  %x: f32[1, 32, 6, 6]
  const  %w1: f32[32, 32, 1, 1]
  const  %w2: f32[32, 32, 3, 3]
  const  %w3: f32[32, 32, 1, 1]
  const  %w4: f32[32, 32, 1, 1]
  const  %s5: i64[5] = [1, 2, 32, 6, 6]
  const  %s4: i64[4] = [1, 64, 6, 6]
  const  %ax: i64[1] = [1]
  const  %z: i64[1] = [0]
  const  %h: i64[1] = [32]
  const  %e: i64[1] = [64]
  %a = Conv(%x, %w1)
  %b = Conv(%x, %w2) {pads=[1, 1, 1, 1]}
  %c = Concat(%a, %b) {axis=1}
  %r = Reshape(%c, %s5)
  %t = Transpose(%r) {perm=[0, 2, 1, 3, 4]}
  %u = Reshape(%t, %s4)
  %p = Slice(%u, %z, %h, %ax)
  %q = Slice(%u, %h, %e, %ax)
  %o1 = Conv(%p, %w3)
  %o2 = Conv(%q, %w4)
  %o = Add(%o1, %o2)
  return %o
)");
  randomize_weights(g, 3);
  PassContext ctx;
  Graph fused = fuse(g);
  infer_types(fused);
  const Graph f = passes::assign_layouts(fused, ctx, 16, false);
  EXPECT_EQ(count_ops(f, "GatherChannels"), 2) << print(f);
  EXPECT_EQ(count_ops(f, "ReorderToBlocked"), 1) << print(f);    // x only
  EXPECT_EQ(count_ops(f, "ReorderFromBlocked"), 1) << print(f);  // the output only
  EXPECT_EQ(ctx.fired.at("AssignLayouts/Propagate/GatherChannels"), 2);
  const std::vector<Tensor> in = random_inputs(g, 5);
  const Tensor want = reference::run(g, in)[0], got = reference::run(f, in)[0];
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-4) << "element " << i;
}

// AssignLayouts makes a Concat, Slice or Split on channels whose parts are not whole blocks a
// GatherChannels (GhostNet's halves of 12 channels, a Split into 17 and 23), and a Resize by
// constant sizes a Resize of the blocked value: no reorder between the convolutions. The
// rewritten graph on the reference interpreter and on the CPU kernels (level 0) gives the
// original's results.
TEST(ChannelMoves, UnalignedChannelMovesAndResizeStayBlocked) {
  Graph g = parse_graph(R"(graph g (opset 18)
  input  %x: f32[2, 32, 6, 6]
  const  %w1: f32[12, 32, 1, 1]
  const  %w2: f32[12, 1, 3, 3]
  const  %w3: f32[40, 20, 1, 1]
  const  %w4: f32[16, 17, 3, 3]
  const  %w5: f32[16, 23, 1, 1]
  const  %w6: f32[16, 16, 1, 1]
  const  %ax: i64[1] = [1]
  const  %z: i64[1] = [0]
  const  %n: i64[1] = [20]
  const  %parts: i64[2] = [17, 23]
  const  %sizes: i64[4] = [2, 16, 12, 9]
  %a = Conv(%x, %w1)
  %b = Conv(%a, %w2) {group=12, pads=[1, 1, 1, 1]}
  %c = Concat(%a, %b) {axis=1}
  %s = Slice(%c, %z, %n, %ax)
  %d = Conv(%s, %w3)
  %p, %q = Split(%d, %parts) {axis=1}
  %e = Conv(%p, %w4) {pads=[1, 1, 1, 1]}
  %f = Conv(%q, %w5)
  %h = Add(%e, %f)
  %r = Resize(%h, _, _, %sizes) {mode="nearest"}
  %o = Conv(%r, %w6)
  return %o
)");
  randomize_weights(g, 21);
  for (int block : {8, 16}) {
    PassContext ctx;
    Graph f = passes::assign_layouts(g, ctx, block, false);
    verify(f);
    infer_types(f);
    EXPECT_EQ(count_ops(f, "GatherChannels"), 4) << print(f);    // the Concat, Slice, 2 Split parts
    EXPECT_EQ(count_ops(f, "ReorderToBlocked"), 1) << print(f);  // x
    EXPECT_EQ(count_ops(f, "ReorderFromBlocked"), 1) << print(f);  // the output
    EXPECT_EQ(ctx.fired.at("AssignLayouts/ChannelMoveAsGather"), 3);
    EXPECT_EQ(ctx.fired.at("AssignLayouts/Propagate/Resize"), 1);
    const std::vector<Tensor> in = random_inputs(g, 5);
    const Tensor want = reference::run(g, in)[0];
    const Tensor ref = reference::run(f, in)[0];
    Executable exe = compile(f, {.level = 0});
    const Tensor cpu = exe.run(in)[0];
    ASSERT_EQ(ref.shape(), want.shape());
    ASSERT_EQ(cpu.shape(), want.shape());
    double scale = 0;  // within 1e-4 of the largest |y| (the CPU's 3x3 conv may be Winograd)
    for (int64_t i = 0; i < want.numel(); ++i)
      scale = std::max(scale, std::fabs(double{want.data<float>()[i]}));
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_NEAR(ref.data<float>()[i], want.data<float>()[i], 1e-5 * scale) << block << ", " << i;
      ASSERT_NEAR(cpu.data<float>()[i], want.data<float>()[i], 1e-4 * scale) << block << ", " << i;
    }
  }
}

// One GatherChannels node over inputs of `c` channels each, picking `picks` (input, channel)
// pairs; NCHW [n, c_i, h, w] or blocked [n, ceil(c_i / b), h, w, b].
Graph gather_graph(const std::vector<int64_t>& channels, const Dims& index, const Dims& channel,
                   int64_t n, int64_t h, int64_t w, int64_t block) {
  Graph g;
  std::vector<ValueId> ins;
  for (size_t i = 0; i < channels.size(); ++i) {
    const Dims d = block ? Dims{n, (channels[i] + block - 1) / block, h, w, block}
                         : Dims{n, channels[i], h, w};
    ins.push_back(g.add_input(cat("x", i), {DType::kF32, to_shape(d)}));
  }
  Attributes a;
  a.set("input_index", index);
  a.set("input_channel", channel);
  const ValueId y = g.add_value("y");
  g.add_node("GatherChannels", ins, {y}, a, "gather").domain = "pto";
  g.add_output(y);
  infer_types(g);
  return g;
}

// The CPU kernel against the reference kernel, bit for bit, on random selections: NCHW, blocks
// of 8 and 16, on every ISA the machine has, with 1 and 2 threads; planes large enough to be cut
// into several parallel pieces, and a selection with a lane from each of 16 source blocks.
TEST(ChannelMoves, CpuKernelMatchesReference) {
  std::mt19937 rng(11);
  const int saved = num_threads();
  struct Shape4 {
    int64_t n, h, w;
  };
  for (const Shape4 s : {Shape4{1, 5, 7}, Shape4{2, 3, 3}, Shape4{1, 64, 70}}) {
    for (int64_t block : {0, 8, 16}) {
      const std::vector<int64_t> channels = {20, 7, 33, 260};
      Dims index, channel;
      const int64_t J = 1 + static_cast<int64_t>(rng() % 40);
      for (int64_t j = 0; j < J; ++j) {
        const auto i = static_cast<int64_t>(rng() % channels.size());
        index.push_back(i);
        channel.push_back(static_cast<int64_t>(rng() % static_cast<uint32_t>(channels[i])));
      }
      if (block == 16 && s.h == 5) {  // each lane of the first output block from its own block
        index.assign(17, 3);
        channel.clear();
        for (int64_t j = 0; j < 16; ++j) channel.push_back(j * 17);
        channel.push_back(259);
      }
      const Graph g = gather_graph(channels, index, channel, s.n, s.h, s.w, block);
      const std::vector<Tensor> in = random_inputs(g, static_cast<uint32_t>(J));
      const Tensor want = reference::run(g, in)[0];
      for (cpu::Isa isa : cpu::supported_isas()) {
        cpu::IsaScope scope(isa);
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          Executable exe = compile(g, {.level = 0});
          ASSERT_EQ(exe.node_backend(0), "cpu");
          const Tensor got = exe.run(in)[0];
          ASSERT_EQ(got.shape(), want.shape());
          // Padded lanes of a blocked output are unspecified: compare the J real channels.
          const int64_t lanes = block ? block : 1, HW = s.h * s.w;
          const int64_t blocks = block ? (J + block - 1) / block : J;
          for (int64_t b = 0; b < s.n; ++b)
            for (int64_t j = 0; j < J; ++j)
              for (int64_t p = 0; p < HW; ++p) {
                const int64_t at = ((b * blocks + j / lanes) * HW + p) * lanes + j % lanes;
                ASSERT_EQ(got.data<float>()[at], want.data<float>()[at])
                    << cpu::isa_name(isa) << ", " << threads << " thread(s), block " << block
                    << ", channel " << j << ", pixel " << p;
              }
        }
      }
    }
  }
  set_num_threads(saved);
}

TEST(ChannelMoves, BadAttributesAreClearErrors) {
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{1, 4, 2, 2}});
  Attributes a;
  a.set("input_index", Dims{0, 1});
  a.set("input_channel", Dims{0, 0});
  const ValueId y = g.add_value("y");
  g.add_node("GatherChannels", {x}, {y}, a, "gather").domain = "pto";
  g.add_output(y);
  try {
    infer_types(g);
    FAIL() << "an input index past the inputs was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("reads channel 0 of input 1 (1 inputs)"),
              std::string::npos)
        << e.what();
  }
  g.mutable_nodes()[0].attrs.set("input_index", Dims{0, 0});
  g.mutable_nodes()[0].attrs.set("input_channel", Dims{0, 4});
  EXPECT_THROW(infer_types(g), ValueError);
}

}  // namespace
}  // namespace pto
