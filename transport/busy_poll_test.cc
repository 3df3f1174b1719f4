#include "transport/busy_poll.h"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include "transport/buffered_stream.h"

namespace kvtier {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(Conversation, IsHotOnlyWhileMessagesComeWithinTheWindow) {
  Conversation c(microseconds(50));
  const auto t0 = Clock::now();
  EXPECT_FALSE(c.arrived(t0));  // the first message finds nobody polling
  EXPECT_TRUE(c.hot(t0 + microseconds(50)));
  EXPECT_TRUE(c.arrived(t0 + microseconds(30)));
  EXPECT_TRUE(c.arrived(t0 + microseconds(80)));  // 50 us after the previous one
  EXPECT_FALSE(c.hot(t0 + microseconds(131)));    // a pause: cold again
  EXPECT_FALSE(c.arrived(t0 + microseconds(1000)));
  EXPECT_TRUE(c.arrived(t0 + microseconds(1010)));
}

TEST(Conversation, AZeroWindowIsNeverHot) {
  Conversation c(microseconds(0));
  const auto t0 = Clock::now();
  EXPECT_FALSE(c.arrived(t0));
  EXPECT_FALSE(c.arrived(t0));
  EXPECT_FALSE(c.hot(t0));
}

TEST(BusyPoller, PollsBrieflyAfterAnyMessageAndForTheWindowInAHotConversation) {
  auto io = kj::setupAsyncIo();
  auto& timer = io.provider->getTimer();
  BusyPoller poller(timer, milliseconds(300));
  poller.arrived();  // one message: polls for its follow-ups only, then stops by itself
  EXPECT_TRUE(poller.polling());
  timer.afterDelay(2 * kj::MILLISECONDS).wait(io.waitScope);
  EXPECT_FALSE(poller.polling());
  // Two messages within the window: a hot conversation, polled for the whole window. The loop
  // keeps running other events meanwhile (this timer fires while it polls).
  poller.arrived();
  poller.arrived();
  timer.afterDelay(2 * kj::MILLISECONDS).wait(io.waitScope);
  EXPECT_TRUE(poller.polling());
  timer.afterDelay(320 * kj::MILLISECONDS).wait(io.waitScope);
  EXPECT_FALSE(poller.polling());
}

TEST(BusyPoller, ANeverPollingPollerWithAZeroWindow) {
  auto io = kj::setupAsyncIo();
  BusyPoller poller(io.provider->getTimer(), microseconds(0));
  poller.arrived();
  poller.arrived();
  EXPECT_FALSE(poller.polling());
}

// Messages over a real socket pair: the reading stream tells the poller of each arrival, and
// reads, writes and other events all complete while it polls.
TEST(BusyPoller, ABufferedStreamReportsArrivalsAndIOProceedsWhilePolling) {
  auto io = kj::setupAsyncIo();
  BusyPoller poller(io.provider->getTimer(), milliseconds(500));
  auto pipe = io.provider->newTwoWayPipe();
  BufferedIoStream reader(kj::mv(pipe.ends[0]), &poller);
  auto& writer = *pipe.ends[1];
  char buf[8] = {};
  for (int i = 0; i < 3; ++i) {
    const char message[] = {'m', static_cast<char>('0' + i)};
    writer.write(message, sizeof message).wait(io.waitScope);
    ASSERT_EQ(reader.tryRead(buf, 2, sizeof buf).wait(io.waitScope), 2u);
    EXPECT_EQ(buf[1], '0' + i);
    EXPECT_TRUE(poller.polling()) << "after message " << i;
  }
  // While polling: a write on one end and a read on the other still complete, and so does a
  // plain continuation.
  auto read = reader.tryRead(buf, 3, sizeof buf);
  writer.write("abc", 3).wait(io.waitScope);
  EXPECT_EQ(read.wait(io.waitScope), 3u);
  EXPECT_EQ(std::string(buf, 3), "abc");
  EXPECT_EQ(kj::evalLater([] { return 7; }).wait(io.waitScope), 7);
}

TEST(WaitForAnswer, ReturnsTheAnswerAndPollsOnlyWhenTheConversationIsHot) {
  auto io = kj::setupAsyncIo();
  auto pipe = io.provider->newTwoWayPipe();
  Conversation answers(milliseconds(500));
  char buf[4] = {};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(answers.hot(), i > 0);
    auto answer = pipe.ends[0]->tryRead(buf, 1, sizeof buf);
    pipe.ends[1]->write("x", 1).wait(io.waitScope);
    EXPECT_EQ(waitForAnswer(kj::mv(answer), io.waitScope, answers), 1u);
  }
  EXPECT_TRUE(answers.hot());
  // A void answer, and one that is already there.
  waitForAnswer(kj::Promise<void>(kj::READY_NOW), io.waitScope, answers);
}

}  // namespace
}  // namespace kvtier
