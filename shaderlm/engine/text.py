"""Token ids to the text a caller may see: whole UTF-8 characters only, and never a piece of a stop
string (held back until it is clear whether a stop string starts there)."""
from __future__ import annotations

from ..formats.tokenizer import StreamDecoder


class TextStream:
    def __init__(self, tokenizer, stops=()):
        self.decoder = StreamDecoder(tokenizer)
        self.stops = [s for s in stops if s]
        self.held = ""             # decoded text that could still turn out to start a stop string
        self.stopped = False       # a stop string appeared: nothing after it is text

    def push(self, token: int) -> str:
        """The text that `token` completes and that can be shown now."""
        if self.stopped:
            return ""
        self.held += self.decoder.push(token)
        if not self.stops:
            out, self.held = self.held, ""
            return out
        cut = min((self.held.find(s) for s in self.stops if s in self.held), default=-1)
        if cut >= 0:
            out, self.held, self.stopped = self.held[:cut], "", True
            return out
        # hold back only a tail that is a prefix of some stop string
        safe = len(self.held) - max(len(s) - 1 for s in self.stops)
        while safe < len(self.held) and not any(s.startswith(self.held[safe:]) for s in self.stops):
            safe += 1
        safe = max(safe, 0)
        out, self.held = self.held[:safe], self.held[safe:]
        return out

    def finish(self) -> str:
        """What is left at the end of generation (an incomplete character becomes U+FFFD)."""
        if self.stopped:
            return ""
        out, self.held = self.held + self.decoder.flush(), ""
        return out
