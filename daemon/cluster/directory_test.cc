#include "daemon/cluster/directory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "daemon/cluster/cluster.h"
#include "daemon/cluster/hash_ring.h"

namespace kvtier {
namespace {

using Members = std::vector<std::string>;
using KeySet = std::unordered_set<DirKey, DirKeyHash>;

// Deterministic: every run draws the same keys.
std::vector<DirKey> randomKeys(size_t n, uint64_t seed = 42) {
  std::mt19937_64 rng(seed);
  std::vector<DirKey> keys(n);
  for (auto& k : keys) {
    k.fingerprint = rng();
    for (auto& b : k.salt) b = static_cast<uint8_t>(rng());
    for (auto& b : k.key.bytes) b = static_cast<uint8_t>(rng());
  }
  return keys;
}

KeySet setOf(const std::vector<DirKey>& keys) { return KeySet(keys.begin(), keys.end()); }

// --- rendezvous hashing

TEST(Rendezvous, HomeIsTheHighestScoringMember) {
  const Members members{"a", "b", "c", "d"};
  for (const DirKey& k : randomKeys(1000)) {
    const std::string& home = homeOf(k, members);
    for (const auto& m : members) EXPECT_LE(rendezvousScore(m, k), rendezvousScore(home, k));
  }
}

TEST(Rendezvous, EveryNodeComputesTheSameHomeWhateverTheMemberOrder) {
  Members members{"a", "b", "c", "d"};
  const auto keys = randomKeys(2000);
  std::vector<std::string> homes;
  for (const DirKey& k : keys) homes.push_back(homeOf(k, members));
  while (std::next_permutation(members.begin(), members.end())) {
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(homeOf(keys[i], members), homes[i])
          << "order " << members[0] << members[1] << members[2] << members[3];
    }
  }
}

TEST(Rendezvous, AMemberJoiningTakesOnlyItsOwnShareOfKeys) {
  const Members before{"a", "b", "c"}, after{"a", "b", "c", "d"};
  const auto keys = randomKeys(20000);
  size_t moved = 0;
  for (const DirKey& k : keys) {
    const std::string& to = homeOf(k, after);
    if (homeOf(k, before) != to) {
      EXPECT_EQ(to, "d");
      ++moved;
    }
  }
  // The new member's fair share is a quarter.
  EXPECT_GE(moved, keys.size() * 15 / 100);
  EXPECT_LE(moved, keys.size() * 35 / 100);
}

TEST(Rendezvous, AMemberLeavingMovesOnlyTheKeysItWasHomeFor) {
  const Members before{"a", "b", "c"}, after{"a", "b"};
  size_t moved = 0;
  for (const DirKey& k : randomKeys(20000)) {
    const std::string& from = homeOf(k, before);
    if (from != homeOf(k, after)) {
      EXPECT_EQ(from, "c");
      ++moved;
    }
  }
  EXPECT_GT(moved, 0u);
}

// --- the consistent-hash ring

Members memberIds(size_t n, const char* prefix = "node-") {
  Members out;
  for (size_t i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

std::vector<uint64_t> randomHashes(size_t n, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> out(n);
  for (auto& h : out) h = rng();
  return out;
}

TEST(HashRing, EveryNodeBuildsTheSameRingWhateverTheMemberOrder) {
  Members members = memberIds(12);
  const HashRing ring(members);
  std::shuffle(members.begin(), members.end(), std::mt19937_64(3));
  members.push_back(members.front());  // a duplicate counts once
  const HashRing other(members);
  ASSERT_EQ(other.size(), 12u);
  for (uint64_t h : randomHashes(5000)) ASSERT_EQ(ring.home(h), other.home(h));
}

TEST(HashRing, AMemberJoiningTakesAboutItsShareAndOnlyForItself) {
  for (size_t n : {3, 16, 128}) {
    const Members before = memberIds(n);
    Members after = before;
    after.push_back("joining");
    const HashRing a(before), b(after);
    const auto hashes = randomHashes(200000);
    size_t moved = 0;
    for (uint64_t h : hashes) {
      if (a.home(h) != b.home(h)) {
        ASSERT_EQ(b.home(h), "joining") << "a hash moved between two members that stayed";
        ++moved;
      }
    }
    const double ideal = double(hashes.size()) / double(n + 1);
    EXPECT_LE(moved, 1.5 * ideal) << n << " members";
    EXPECT_GE(moved, 0.5 * ideal) << n << " members";
  }
}

TEST(HashRing, AMemberLeavingHandsOnlyItsOwnHashesToOthers) {
  const Members before = memberIds(16);
  Members after = before;
  after.erase(after.begin() + 5);
  const HashRing a(before), b(after);
  for (uint64_t h : randomHashes(50000)) {
    if (a.home(h) != b.home(h)) {
      ASSERT_EQ(a.home(h), before[5]);
    }
  }
}

TEST(HashRing, EachMembersShareIsNearOneOverN) {
  const size_t n = 64;
  const HashRing ring(memberIds(n));
  std::vector<size_t> count(n, 0);
  const auto hashes = randomHashes(640000);
  for (uint64_t h : hashes) ++count[ring.homeIndex(h)];
  const double mean = double(hashes.size()) / n;
  EXPECT_LE(*std::max_element(count.begin(), count.end()), 1.5 * mean);
  EXPECT_GE(*std::min_element(count.begin(), count.end()), 0.5 * mean);
}

TEST(HashRing, ReplicasAreDistinctMembersStartingWithTheHome) {
  const HashRing ring(memberIds(5));
  for (uint64_t h : randomHashes(2000)) {
    const auto homes = ring.homes(h, 3);
    ASSERT_EQ(homes.size(), 3u);
    EXPECT_EQ(homes[0], ring.homeIndex(h));
    EXPECT_EQ(std::unordered_set<size_t>(homes.begin(), homes.end()).size(), 3u);
  }
  EXPECT_EQ(ring.homes(42, 9).size(), 5u) << "never more replicas than members";
  EXPECT_TRUE(HashRing().homes(42, 3).empty());
}

// --- filing by anchor

// A key filed under itself (its place unknown).
DirEntry self(const DirKey& k) { return DirEntry{k, k.key}; }
std::vector<DirEntry> selves(const std::vector<DirKey>& keys) {
  std::vector<DirEntry> out;
  for (const DirKey& k : keys) out.push_back(self(k));
  return out;
}
KeySet keysOf(const std::vector<DirEntry>& entries) {
  KeySet out;
  for (const DirEntry& e : entries) out.insert(e.key);
  return out;
}
// Keys of one namespace, as a prompt's chain has.
std::vector<DirKey> chainKeys(size_t n) {
  auto keys = randomKeys(n);
  for (auto& k : keys) {
    k.fingerprint = keys[0].fingerprint;
    k.salt = keys[0].salt;
  }
  return keys;
}
std::vector<Key128> chainOf(const std::vector<DirKey>& keys) {
  std::vector<Key128> out;
  for (const DirKey& k : keys) out.push_back(k.key);
  return out;
}

TEST(Anchors, ABlockIsFiledUnderItsSegmentsAnchorAndAnAnchorUnderEveryEarlierOne) {
  const auto chain = chainOf(randomKeys(3 * kSegmentBlocks + 5));
  auto filed = [&](size_t position) {
    return anchorsFiledUnder(std::span<const Key128>(chain).first(position + 1));
  };
  EXPECT_TRUE(anchorsFiledUnder({}).empty()) << "no chain: the place is unknown";
  EXPECT_EQ(filed(0), (std::vector<Key128>{chain[0]})) << "the first block is its own anchor";
  EXPECT_EQ(filed(1), (std::vector<Key128>{chain[0]}));
  EXPECT_EQ(filed(kSegmentBlocks - 1), (std::vector<Key128>{chain[0]}));
  EXPECT_EQ(filed(kSegmentBlocks), (std::vector<Key128>{chain[0], chain[kSegmentBlocks]}));
  EXPECT_EQ(filed(kSegmentBlocks + 7), (std::vector<Key128>{chain[kSegmentBlocks]}));
  EXPECT_EQ(filed(3 * kSegmentBlocks),
            (std::vector<Key128>{chain[0], chain[kSegmentBlocks], chain[2 * kSegmentBlocks],
                                 chain[3 * kSegmentBlocks]}));
  EXPECT_EQ(filed(3 * kSegmentBlocks + 4), (std::vector<Key128>{chain[3 * kSegmentBlocks]}));
}

TEST(Anchors, OneHomeKnowsAWholeSegmentAndTheDeeperAnchorsPastIt) {
  const HashRing ring(memberIds(64));
  const auto keys = chainKeys(4 * kSegmentBlocks);
  const auto chain = chainOf(keys);
  HeldKeys held;
  for (size_t i = 0; i < keys.size(); ++i) {
    held.hold(keys[i], anchorsFiledUnder(std::span<const Key128>(chain).first(i + 1)), ring);
  }
  // Everything filed under the second segment's anchor: its 64 keys and the two anchors after
  // it, at one home.
  const DirKey anchor = keys[kSegmentBlocks];
  const std::string& home = homeOf(DirEntry{anchor, anchor.key}, ring);
  const auto batch = held.take(home, SIZE_MAX);
  KeySet under;
  for (const DirEntry& e : batch.add) {
    if (e.under == anchor.key) under.insert(e.key);
  }
  KeySet want(keys.begin() + kSegmentBlocks, keys.begin() + 2 * kSegmentBlocks);
  want.insert(keys[2 * kSegmentBlocks]);
  want.insert(keys[3 * kSegmentBlocks]);
  EXPECT_EQ(under, want);
  // Entries in all: a key each, plus each anchor under the anchors before it (1 + 2 + 3).
  size_t total = batch.add.size();
  for (const auto& h : held.pendingHomes()) total += held.take(h, SIZE_MAX).add.size();
  EXPECT_EQ(total, keys.size() + 6);
}

TEST(HeldKeys, EachEntryGoesToItsReplicaHomesAndARehomeOnlyToTheNewOnes) {
  const HashRing before(memberIds(8)), after([] {
    auto m = memberIds(8);
    m.push_back("joining");
    return m;
  }());
  const auto keys = randomKeys(3000);
  HeldKeys held(3);
  for (const DirKey& k : keys) held.hold(k, {}, before);
  size_t queued = 0;
  for (const auto& home : before.members()) {
    for (const DirEntry& e : held.take(home, SIZE_MAX).add) {
      const auto homes = homesOf(e, before, 3);
      ASSERT_EQ(homes.size(), 3u);
      ASSERT_EQ(homes[0], homeOf(e, before));
      EXPECT_NE(std::find(homes.begin(), homes.end(), home), homes.end());
      ++queued;
    }
  }
  EXPECT_EQ(queued, 3 * keys.size()) << "three distinct homes each";
  // A member joins: each entry it becomes a home of goes to it, and only to it.
  size_t gained = 0;
  for (const DirKey& k : keys) {
    const auto homes = homesOf(self(k), after, 3);
    gained += std::find(homes.begin(), homes.end(), "joining") != homes.end();
  }
  EXPECT_EQ(held.rehome(before, after), gained);
  EXPECT_EQ(held.pendingHomes(), (Members{"joining"}));
  // About 3/9 of the entries: three homes out of nine members.
  EXPECT_GT(gained, keys.size() * 2 / 9);
  EXPECT_LT(gained, keys.size() * 4 / 9);
  // A home drops exactly the entries it is no longer one of the three homes of.
  HomeDirectory dir;
  for (const DirKey& k : keys) dir.add("x", self(k));
  size_t mine = 0;
  for (const DirKey& k : keys) {
    const auto homes = homesOf(self(k), after, 3);
    mine += std::find(homes.begin(), homes.end(), "node-2") != homes.end();
  }
  EXPECT_EQ(dir.dropNotHome("node-2", after, 3), keys.size() - mine);
  EXPECT_EQ(dir.size(), mine);
}

TEST(HeldKeys, AKeyWhosePlaceWasUnknownMovesToItsAnchorOnce) {
  const HashRing ring(memberIds(16));
  const auto keys = chainKeys(kSegmentBlocks + 1);
  const auto chain = chainOf(keys);
  const DirKey k = keys[5];
  const Key128 anchor = keys[0].key;
  HeldKeys held;
  ASSERT_TRUE(held.hold(k, {}, ring));  // read back from disk: place unknown
  (void)held.take(homeOf(self(k), ring), SIZE_MAX);
  EXPECT_FALSE(held.hold(k, {anchor}, ring)) << "not new";
  EXPECT_EQ(*held.placeOf(k), (std::vector<Key128>{anchor}));
  const std::string& oldHome = homeOf(self(k), ring);
  const std::string& newHome = homeOf(DirEntry{k, anchor}, ring);
  auto withdrawn = held.take(oldHome, SIZE_MAX).withdraw;
  if (oldHome == newHome) {
    EXPECT_EQ(withdrawn, (std::vector<DirEntry>{self(k)}));
  } else {
    EXPECT_EQ(withdrawn, (std::vector<DirEntry>{self(k)}));
    EXPECT_EQ(held.take(newHome, SIZE_MAX).add, (std::vector<DirEntry>{DirEntry{k, anchor}}));
  }
  // A known place never changes again.
  EXPECT_FALSE(held.hold(k, {}, ring));
  EXPECT_FALSE(held.hold(k, {keys[1].key}, ring));
  EXPECT_EQ(*held.placeOf(k), (std::vector<Key128>{anchor}));
  EXPECT_EQ(held.pending(), 0u);
  // Dropping it withdraws each entry it is filed under.
  const DirKey a = keys[kSegmentBlocks];
  held.hold(a, anchorsFiledUnder(chain), ring);
  for (const auto& h : held.pendingHomes()) (void)held.take(h, SIZE_MAX);
  ASSERT_TRUE(held.drop(a, ring));
  EXPECT_EQ(held.pending(), 2u) << "an anchor of the second segment is filed under two anchors";
  EXPECT_EQ(held.placeOf(a), nullptr);
}

// --- HomeDirectory

TEST(HomeDirectory, AddAndWithdrawHolders) {
  const DirEntry k = self(randomKeys(1)[0]);
  HomeDirectory dir;
  EXPECT_TRUE(dir.holders(k).empty());
  dir.add("a", k);
  dir.add("b", k);
  dir.add("a", k);  // already known: still one entry for a
  EXPECT_EQ(dir.holders(k), (Members{"a", "b"}));
  EXPECT_EQ(dir.size(), 1u);
  dir.withdraw("a", k);
  EXPECT_EQ(dir.holders(k), (Members{"b"}));
  dir.withdraw("x", k);  // never held it: nothing changes
  EXPECT_EQ(dir.holders(k), (Members{"b"}));
  dir.withdraw("b", k);
  EXPECT_TRUE(dir.holders(k).empty());
  EXPECT_EQ(dir.size(), 0u);
}

TEST(HomeDirectory, KeepsAtMostMaxHoldersPerKeyAndTheNewest) {
  const DirEntry k = self(randomKeys(1)[0]);
  HomeDirectory dir;
  const size_t n = HomeDirectory::kMaxHoldersPerKey + 3;
  for (size_t i = 0; i < n; ++i) dir.add("node-" + std::to_string(i), k);
  const auto& holders = dir.holders(k);
  EXPECT_EQ(holders.size(), HomeDirectory::kMaxHoldersPerKey);
  EXPECT_NE(std::find(holders.begin(), holders.end(), "node-" + std::to_string(n - 1)),
            holders.end());
  EXPECT_EQ(std::find(holders.begin(), holders.end(), "node-0"), holders.end());
}

TEST(HomeDirectory, ForgetNodeRemovesItEverywhereAndCountsTheEntries) {
  const auto keys = selves(randomKeys(3));
  HomeDirectory dir;
  dir.add("a", keys[0]);
  dir.add("b", keys[0]);
  dir.add("a", keys[1]);
  dir.add("b", keys[2]);
  EXPECT_EQ(dir.forgetNode("a"), 2u);
  EXPECT_EQ(dir.holders(keys[0]), (Members{"b"}));
  EXPECT_TRUE(dir.holders(keys[1]).empty());
  EXPECT_EQ(dir.holders(keys[2]), (Members{"b"}));
  EXPECT_EQ(dir.size(), 2u);
  EXPECT_EQ(dir.forgetNode("a"), 0u);
  EXPECT_EQ(dir.forgetNode("b"), 2u);
  EXPECT_EQ(dir.size(), 0u);
}

TEST(HomeDirectory, DropNotHomeDropsExactlyTheEntriesAnotherMemberIsHomeFor) {
  const HashRing members(Members{"a", "b", "c"});
  const auto keys = selves(randomKeys(3000));
  HomeDirectory dir;
  size_t notMine = 0;
  for (const DirEntry& k : keys) {
    dir.add("x", k);
    notMine += homeOf(k, members) != "a";
  }
  EXPECT_EQ(dir.dropNotHome("a", HashRing()), 0u);  // no members: nothing to judge by
  EXPECT_EQ(dir.size(), keys.size());
  EXPECT_EQ(dir.dropNotHome("a", members), notMine);
  EXPECT_EQ(dir.size(), keys.size() - notMine);
  for (const DirEntry& k : keys) {
    EXPECT_EQ(dir.holders(k).empty(), homeOf(k, members) != "a");
  }
}

// --- HeldKeys

TEST(HeldKeys, HoldAndDropQueueAMessageForTheKeysHome) {
  const HashRing members(Members{"a", "b", "c"});
  const DirKey k = randomKeys(1)[0];
  const std::string home = homeOf(self(k), members);
  HeldKeys held;
  EXPECT_TRUE(held.hold(k, {}, members));
  EXPECT_FALSE(held.hold(k, {}, members));
  EXPECT_TRUE(held.holds(k));
  EXPECT_EQ(held.pending(), 1u);
  EXPECT_EQ(held.pendingFor(home), 1u);
  EXPECT_EQ(held.pendingHomes(), (Members{home}));
  auto batch = held.take(home, 10);
  EXPECT_EQ(batch.add, (std::vector<DirEntry>{self(k)}));
  EXPECT_TRUE(batch.withdraw.empty());
  EXPECT_EQ(held.pending(), 0u);
  EXPECT_TRUE(held.pendingHomes().empty());

  EXPECT_TRUE(held.drop(k, members));
  EXPECT_FALSE(held.drop(k, members));
  EXPECT_FALSE(held.holds(k));
  batch = held.take(home, 10);
  EXPECT_TRUE(batch.add.empty());
  EXPECT_EQ(batch.withdraw, (std::vector<DirEntry>{self(k)}));
  EXPECT_EQ(held.pending(), 0u);
}

TEST(HeldKeys, OnlyTheLastMessageForAKeyLeaves) {
  const HashRing members(Members{"a"});
  const DirKey k = randomKeys(1)[0];
  HeldKeys held;
  ASSERT_TRUE(held.hold(k, {}, members));
  ASSERT_TRUE(held.drop(k, members));
  EXPECT_EQ(held.pending(), 1u);
  auto batch = held.take("a", 10);
  EXPECT_TRUE(batch.add.empty());
  EXPECT_EQ(batch.withdraw, (std::vector<DirEntry>{self(k)}));

  ASSERT_TRUE(held.hold(k, {}, members));
  ASSERT_TRUE(held.drop(k, members));
  ASSERT_TRUE(held.hold(k, {}, members));
  EXPECT_EQ(held.pending(), 1u);
  batch = held.take("a", 10);
  EXPECT_EQ(batch.add, (std::vector<DirEntry>{self(k)}));
  EXPECT_TRUE(batch.withdraw.empty());
}

TEST(HeldKeys, TakeRespectsMaxAndPendingCounts) {
  const HashRing members(Members{"a"});
  const auto keys = randomKeys(10);
  HeldKeys held;
  for (const DirKey& k : keys) held.hold(k, {}, members);
  EXPECT_EQ(held.pending(), 10u);
  EXPECT_TRUE(held.take("b", 10).empty());  // nothing queued for b
  EXPECT_EQ(held.take("a", 0).size(), 0u);
  auto first = held.take("a", 3);
  EXPECT_EQ(first.size(), 3u);
  EXPECT_EQ(held.pending(), 7u);
  EXPECT_EQ(held.pendingFor("a"), 7u);
  auto rest = held.take("a", 100);
  EXPECT_EQ(rest.size(), 7u);
  EXPECT_EQ(held.pending(), 0u);
  EXPECT_TRUE(held.pendingHomes().empty());
  KeySet taken = keysOf(first.add);
  for (const auto& e : rest.add) taken.insert(e.key);
  EXPECT_EQ(taken, setOf(keys));
}

TEST(HeldKeys, RehomeQueuesAnAddToTheNewHomeOfExactlyTheKeysThatMoved) {
  const HashRing before(Members{"a", "b", "c"}), after(Members{"a", "b", "c", "d"});
  const auto keys = randomKeys(4000);
  HeldKeys held;
  for (const DirKey& k : keys) held.hold(k, {}, before);
  for (const auto& home : held.pendingHomes()) (void)held.take(home, SIZE_MAX);
  ASSERT_EQ(held.pending(), 0u);

  KeySet moved;
  for (const DirKey& k : keys) {
    if (homeOf(self(k), before) != homeOf(self(k), after)) moved.insert(k);
  }
  ASSERT_FALSE(moved.empty());
  EXPECT_EQ(held.rehome(before, after), moved.size());
  EXPECT_EQ(held.pending(), moved.size());
  EXPECT_EQ(held.pendingHomes(), (Members{"d"}));
  auto batch = held.take("d", SIZE_MAX);
  EXPECT_TRUE(batch.withdraw.empty());
  EXPECT_EQ(keysOf(batch.add), moved);

  // c leaves: its keys go to their new homes among a, b and d.
  const HashRing afterLeave(Members{"a", "b", "d"});
  size_t fromC = 0;
  for (const DirKey& k : keys) fromC += homeOf(self(k), after) == "c";
  EXPECT_EQ(held.rehome(after, afterLeave), fromC);
  size_t queued = 0;
  for (const auto& home : held.pendingHomes()) {
    for (const DirEntry& k : held.take(home, SIZE_MAX).add) {
      EXPECT_EQ(homeOf(k, after), "c");
      EXPECT_EQ(homeOf(k, afterLeave), home);
      ++queued;
    }
  }
  EXPECT_EQ(queued, fromC);
}

TEST(HeldKeys, RehomeFromNoMembersQueuesEveryKey) {
  const HashRing members(Members{"a", "b"});
  const auto keys = randomKeys(500);
  HeldKeys held;
  for (const DirKey& k : keys) held.hold(k, {}, HashRing());
  EXPECT_EQ(held.pending(), 0u);  // no home to tell yet
  EXPECT_EQ(held.rehome(HashRing(), HashRing()), 0u);
  EXPECT_EQ(held.rehome(HashRing(), members), keys.size());
  EXPECT_EQ(held.pending(), keys.size());
  for (const auto& home : members.members()) {
    for (const DirEntry& k : held.take(home, SIZE_MAX).add) EXPECT_EQ(homeOf(k, members), home);
  }
  EXPECT_EQ(held.pending(), 0u);
}

TEST(HeldKeys, ResendToQueuesExactlyTheKeysAReconnectingHomeIsHomeFor) {
  const HashRing members(Members{"a", "b", "c"});
  const auto keys = randomKeys(900);
  HeldKeys held;
  for (const DirKey& k : keys) held.hold(k, {}, HashRing());
  size_t homedAtB = 0;
  for (const DirKey& k : keys) homedAtB += homeOf(self(k), members) == "b";
  EXPECT_EQ(held.resendTo("b", members), homedAtB);
  EXPECT_EQ(held.pending(), homedAtB);
  EXPECT_TRUE(held.pendingHomes() == std::vector<std::string>{"b"});
  for (const DirEntry& k : held.take("b", SIZE_MAX).add) EXPECT_EQ(homeOf(k, members), "b");
  EXPECT_EQ(held.resendTo("d", members), 0u);  // not a member: home of nothing
  EXPECT_EQ(held.resendTo("b", HashRing()), 0u);
}

TEST(HeldKeys, RequeuePutsBackOnlyWhatStillHolds) {
  const HashRing members(Members{"a"});
  const auto k = randomKeys(6);
  HeldKeys held;
  for (int i = 0; i < 3; ++i) held.hold(k[i], {}, members);
  for (int i = 3; i < 6; ++i) {
    held.hold(k[i], {}, members);
    held.drop(k[i], members);
  }
  const auto batch = held.take("a", SIZE_MAX);  // add k0-k2, withdraw k3-k5
  ASSERT_EQ(batch.add.size(), 3u);
  ASSERT_EQ(batch.withdraw.size(), 3u);

  // Meanwhile, with no home to tell (members empty): k1 is dropped, k4 held again.
  held.drop(k[1], HashRing());
  held.hold(k[4], {}, HashRing());
  held.requeue("a", batch);
  EXPECT_EQ(held.pending(), 4u);
  const auto again = held.take("a", SIZE_MAX);
  EXPECT_EQ(keysOf(again.add), (KeySet{k[0], k[2]}));
  EXPECT_EQ(keysOf(again.withdraw), (KeySet{k[3], k[5]}));

  // Nothing of the batch still holds: nothing is queued for the home.
  HeldKeys none;
  HeldKeys::Batch adds;
  adds.add = batch.add;
  none.requeue("a", adds);
  EXPECT_EQ(none.pending(), 0u);
  EXPECT_TRUE(none.pendingHomes().empty());
}

TEST(HeldKeys, RequeueNeverOverridesANewerMessage) {
  const HashRing members(Members{"a"});
  const auto k = randomKeys(2);
  HeldKeys held;
  held.hold(k[0], {}, members);
  held.hold(k[1], {}, members);
  held.drop(k[1], members);
  const auto batch = held.take("a", SIZE_MAX);  // add k0, withdraw k1
  // Newer messages: a withdraw of k0, an add of k1. Each key is then changed back without a home
  // to tell, so that the batch's message alone would pass requeue's still-holds check.
  held.drop(k[0], members);
  held.hold(k[0], {}, HashRing());
  held.hold(k[1], {}, members);
  held.drop(k[1], HashRing());
  ASSERT_EQ(held.pending(), 2u);
  held.requeue("a", batch);
  EXPECT_EQ(held.pending(), 2u);
  const auto sent = held.take("a", SIZE_MAX);
  EXPECT_EQ(sent.withdraw, (std::vector<DirEntry>{self(k[0])}));
  EXPECT_EQ(sent.add, (std::vector<DirEntry>{self(k[1])}));
}

TEST(HeldKeys, DropQueueForgetsOnlyThatHomesMessages) {
  const HashRing members(Members{"a", "b"});
  const auto keys = randomKeys(200);
  HeldKeys held;
  for (const DirKey& k : keys) held.hold(k, {}, members);
  const size_t forA = held.pendingFor("a"), forB = held.pendingFor("b");
  ASSERT_GT(forA, 0u);
  ASSERT_GT(forB, 0u);
  ASSERT_EQ(forA + forB, keys.size());
  held.dropQueue("a");
  held.dropQueue("x");  // nothing queued: no-op
  EXPECT_EQ(held.pendingFor("a"), 0u);
  EXPECT_EQ(held.pending(), forB);
  EXPECT_EQ(held.pendingHomes(), (Members{"b"}));
  EXPECT_EQ(held.size(), keys.size());  // still held: rehome() tells their new home
  for (const DirKey& k : keys) EXPECT_TRUE(held.holds(k));
}

// --- the cluster token

TEST(ClusterToken, LoopbackListenersNeedNoToken) {
  for (const char* listen : {"127.0.0.1:1", "localhost:1", "[::1]:1"}) {
    EXPECT_TRUE(isLoopbackHost(listen)) << listen;
    EXPECT_TRUE(checkClusterToken(listen, "").ok()) << listen;
  }
}

TEST(ClusterToken, ListenersOffLoopbackNeedAtLeast32Bytes) {
  ASSERT_EQ(kMinClusterTokenBytes, 32u);
  for (const char* listen : {"0.0.0.0:7000", "10.1.2.3:7000"}) {
    EXPECT_FALSE(isLoopbackHost(listen)) << listen;
    for (size_t bytes : {size_t{0}, size_t{31}}) {
      const Status s = checkClusterToken(listen, std::string(bytes, 't'));
      ASSERT_FALSE(s.ok()) << listen << " " << bytes;
      EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(s.error().message().find("--cluster-token-file"), std::string::npos)
          << s.error().message();
    }
    EXPECT_TRUE(checkClusterToken(listen, std::string(32, 't')).ok()) << listen;
  }
}

}  // namespace
}  // namespace kvtier
