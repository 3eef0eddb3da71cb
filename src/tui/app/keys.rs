//! Keyboard, mouse and paste input: the table of key bindings (each key named once, with its line
//! of the help screen) and what each bound action does.
//!
//! Owns `KEY_BINDINGS`, `App::on_key`, `App::on_mouse` and `App::on_paste`. Slash commands typed in
//! the box are `commands`'; text editing itself is `widgets::input::InputState`'s.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseEvent, MouseEventKind};

use super::{App, Item, Phase};
use crate::tui::effect::Effect;

/// Which modifiers a chord accepts (Shift is part of the character for printable keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mods {
    /// Any modifiers, or none.
    Any,
    /// Control held (others allowed).
    Ctrl,
    /// Control not held.
    NoCtrl,
    /// Neither Control nor Alt held.
    NoCtrlAlt,
    /// None of Control, Alt and Shift.
    Bare,
    /// At least one of Control, Alt and Shift.
    Modified,
}

impl Mods {
    fn accept(self, m: KeyModifiers) -> bool {
        let ctrl = m.contains(KeyModifiers::CONTROL);
        let alt = m.contains(KeyModifiers::ALT);
        let shift = m.contains(KeyModifiers::SHIFT);
        match self {
            Mods::Any => true,
            Mods::Ctrl => ctrl,
            Mods::NoCtrl => !ctrl,
            Mods::NoCtrlAlt => !ctrl && !alt,
            Mods::Bare => !ctrl && !alt && !shift,
            Mods::Modified => ctrl || alt || shift,
        }
    }
}

/// When a chord applies; otherwise the key goes on to the next binding (and in the end to the
/// input box).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    Always,
    /// The input box is empty.
    InputEmpty,
    /// The chat is scrolled up, or the input box is empty.
    ScrolledOrInputEmpty,
    /// Browsing the history.
    Recalling,
    /// Browsing the history, or the input box is empty.
    RecallingOrInputEmpty,
}

/// What a key does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAction {
    Send,
    NewLine,
    HistoryBack,
    HistoryForward,
    /// Esc: cancel the answer; when idle, the second press quits.
    CancelOrArmQuit,
    /// Ctrl+C: cancel the answer, or quit when idle.
    CancelOrQuit,
    PageUp,
    PageDown,
    /// Scroll to the end and follow the stream again.
    Follow,
    ScrollToTop,
    /// Complete a slash command being typed, else show or hide the selected turn's reasoning.
    CompleteOrToggleReasoning,
    SelectPreviousTurn,
    SelectNextTurn,
    CopyAnswer,
    Clear,
    Help,
    ToggleSidePanel,
    // Editing the input box.
    DeleteToLineStart,
    DeleteWord,
    LineStart,
    LineEnd,
    Backspace,
    Delete,
    Left,
    Right,
    CursorUp,
    CursorDown,
}

/// One key (code and modifiers) bound to an action, under a condition.
#[derive(Clone, Copy, Debug)]
pub struct Chord {
    pub code: KeyCode,
    pub mods: Mods,
    pub when: When,
    pub action: KeyAction,
}

const fn chord(code: KeyCode, mods: Mods, action: KeyAction) -> Chord {
    chord_when(code, mods, When::Always, action)
}

/// A key with any modifiers, always.
const fn press(code: KeyCode, action: KeyAction) -> Chord {
    chord(code, Mods::Any, action)
}

/// A key with Control held, always.
const fn ctrl(code: KeyCode, action: KeyAction) -> Chord {
    chord(code, Mods::Ctrl, action)
}

const fn chord_when(code: KeyCode, mods: Mods, when: When, action: KeyAction) -> Chord {
    Chord {
        code,
        mods,
        when,
        action,
    }
}

/// A row of the key table: its keys and, when `in_help`, its line of the help screen.
#[derive(Clone, Copy, Debug)]
pub struct KeyBinding {
    /// The keys as the help screen names them (empty for a note).
    pub label: &'static str,
    pub help: &'static str,
    pub chords: &'static [Chord],
    /// Listed on the help screen (the editing keys, which work as in a shell, and Ctrl+Home are
    /// not).
    pub in_help: bool,
}

const fn row(label: &'static str, help: &'static str, chords: &'static [Chord]) -> KeyBinding {
    KeyBinding {
        label,
        help,
        chords,
        in_help: true,
    }
}

const fn unlisted(label: &'static str, help: &'static str, chords: &'static [Chord]) -> KeyBinding {
    KeyBinding {
        in_help: false,
        ..row(label, help, chords)
    }
}

use KeyAction as A;
use KeyCode as K;

/// Every key binding, in the help screen's order. A key is looked up top to bottom: the first chord
/// that matches and whose condition holds decides; an unbound printable character is typed.
pub const KEY_BINDINGS: &[KeyBinding] = &[
    row("Enter", "send", &[chord(K::Enter, Mods::Bare, A::Send)]),
    row(
        "Alt+Enter",
        "new line (or Ctrl+J)",
        &[
            ctrl(K::Char('j'), A::NewLine),
            chord(K::Enter, Mods::Modified, A::NewLine),
        ],
    ),
    row(
        "Up/Down",
        "history (empty box)",
        &[
            chord_when(K::Up, Mods::NoCtrl, When::RecallingOrInputEmpty, A::HistoryBack),
            chord_when(K::Down, Mods::NoCtrl, When::Recalling, A::HistoryForward),
        ],
    ),
    row("Esc", "cancel; twice: quit", &[press(K::Esc, A::CancelOrArmQuit)]),
    row("Ctrl+C", "cancel, quit if idle", &[ctrl(K::Char('c'), A::CancelOrQuit)]),
    row(
        "PgUp/PgDn",
        "scroll (or wheel)",
        &[press(K::PageUp, A::PageUp), press(K::PageDown, A::PageDown)],
    ),
    row(
        "End",
        "follow the stream",
        &[
            ctrl(K::End, A::Follow),
            chord_when(K::End, Mods::Any, When::ScrolledOrInputEmpty, A::Follow),
        ],
    ),
    row(
        "Tab",
        "show/hide reasoning",
        &[
            press(K::Tab, A::CompleteOrToggleReasoning),
            press(K::BackTab, A::CompleteOrToggleReasoning),
        ],
    ),
    row(
        "Ctrl+Up/Dn",
        "select turn for Tab",
        &[ctrl(K::Up, A::SelectPreviousTurn), ctrl(K::Down, A::SelectNextTurn)],
    ),
    row("Ctrl+Y", "copy answer (OSC 52)", &[ctrl(K::Char('y'), A::CopyAnswer)]),
    row("Ctrl+L", "clear conversation", &[ctrl(K::Char('l'), A::Clear)]),
    row(
        "F1, ?",
        "this help",
        &[
            press(K::F(1), A::Help),
            chord_when(K::Char('?'), Mods::NoCtrlAlt, When::InputEmpty, A::Help),
        ],
    ),
    row("F2", "side panel on/off", &[press(K::F(2), A::ToggleSidePanel)]),
    row("", "paste keeps newlines", &[]),
    unlisted("Ctrl+Home", "scroll to the top", &[ctrl(K::Home, A::ScrollToTop)]),
    unlisted(
        "Ctrl+U",
        "delete to the line start",
        &[ctrl(K::Char('u'), A::DeleteToLineStart)],
    ),
    unlisted(
        "Ctrl+W",
        "delete the word before the cursor",
        &[ctrl(K::Char('w'), A::DeleteWord)],
    ),
    unlisted(
        "Ctrl+A, Home",
        "line start",
        &[ctrl(K::Char('a'), A::LineStart), press(K::Home, A::LineStart)],
    ),
    unlisted(
        "Ctrl+E, End",
        "line end",
        &[ctrl(K::Char('e'), A::LineEnd), press(K::End, A::LineEnd)],
    ),
    unlisted(
        "Backspace, Delete",
        "delete a character",
        &[press(K::Backspace, A::Backspace), press(K::Delete, A::Delete)],
    ),
    unlisted(
        "Left/Right/Up/Down",
        "move the cursor",
        &[
            press(K::Left, A::Left),
            press(K::Right, A::Right),
            press(K::Up, A::CursorUp),
            press(K::Down, A::CursorDown),
        ],
    ),
];

impl KeyAction {
    /// Edits the input box (leaves history browsing).
    fn edits_input(self) -> bool {
        matches!(
            self,
            A::DeleteToLineStart
                | A::DeleteWord
                | A::LineStart
                | A::LineEnd
                | A::Backspace
                | A::Delete
                | A::Left
                | A::Right
                | A::CursorUp
                | A::CursorDown
        )
    }
}

impl App {
    fn condition_holds(&self, when: When) -> bool {
        match when {
            When::Always => true,
            When::InputEmpty => self.input.is_empty(),
            When::ScrolledOrInputEmpty => self.scroll_top.is_some() || self.input.is_empty(),
            When::Recalling => self.history_pos.is_some(),
            When::RecallingOrInputEmpty => self.history_pos.is_some() || self.input.is_empty(),
        }
    }

    /// The action `key` is bound to in the current state.
    pub fn key_action(&self, key: &KeyEvent) -> Option<KeyAction> {
        KEY_BINDINGS
            .iter()
            .flat_map(|b| b.chords)
            .find(|c| c.code == key.code && c.mods.accept(key.modifiers) && self.condition_holds(c.when))
            .map(|c| c.action)
    }

    /// Handles a key; returns what the run loop must do.
    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        let effects = self.apply_key(key);
        self.refresh_chat_cache();
        effects
    }

    fn apply_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let was_armed = std::mem::take(&mut self.quit_armed);
        if !matches!(key.code, KeyCode::Esc) {
            self.status = None;
        }
        // The failed state and the help overlay take every key.
        if let Phase::Failed(_) = self.phase {
            match key.code {
                KeyCode::Esc | KeyCode::Enter | KeyCode::Char('q') => self.should_quit = true,
                KeyCode::Char('c') if ctrl => self.should_quit = true,
                _ => {}
            }
            return Vec::new();
        }
        if self.sessions.list.is_some() {
            if ctrl && key.code == KeyCode::Char('c') {
                self.should_quit = true;
            }
            return self.sessions_list_key(key.code);
        }
        if self.show_help {
            if ctrl && key.code == KeyCode::Char('c') {
                self.should_quit = true;
            }
            self.show_help = false;
            return Vec::new();
        }
        match self.key_action(&key) {
            Some(action) if !action.edits_input() => self.run_key_action(action, was_armed),
            action => {
                self.history_pos = None;
                match action {
                    Some(a) => self.edit_input(a),
                    None => {
                        if let KeyCode::Char(c) = key.code
                            && !ctrl
                        {
                            self.input.insert_char(c);
                        }
                    }
                }
                Vec::new()
            }
        }
    }

    fn run_key_action(&mut self, action: KeyAction, was_armed: bool) -> Vec<Effect> {
        match action {
            A::Send => return self.enter(),
            A::NewLine => self.input.insert_char('\n'),
            A::HistoryBack => self.recall(-1),
            A::HistoryForward => self.recall(1),
            A::CancelOrArmQuit => {
                if self.is_busy() {
                    return self.cancel();
                }
                if was_armed {
                    self.should_quit = true;
                } else {
                    self.quit_armed = true;
                    self.status = Some("press Esc again to quit".into());
                }
            }
            A::CancelOrQuit => {
                if self.is_busy() {
                    return self.cancel();
                }
                self.should_quit = true;
            }
            A::PageUp => self.scroll_by(-self.page()),
            A::PageDown => self.scroll_by(self.page()),
            A::Follow => {
                self.scroll_top = None;
                self.input.end();
            }
            A::ScrollToTop => self.scroll_top = Some(0),
            A::CompleteOrToggleReasoning => {
                if self.input.text.starts_with('/') && !self.input.text.contains(' ') {
                    self.complete_slash();
                } else {
                    self.toggle_reasoning();
                }
            }
            A::SelectPreviousTurn => self.select_turn(-1),
            A::SelectNextTurn => self.select_turn(1),
            A::CopyAnswer => return self.copy_last_answer(),
            A::Clear => return self.clear(),
            A::Help => self.show_help = true,
            A::ToggleSidePanel => self.side_panel = !self.side_panel,
            editing => self.edit_input(editing),
        }
        Vec::new()
    }

    fn edit_input(&mut self, action: KeyAction) {
        let input = &mut self.input;
        match action {
            A::DeleteToLineStart => input.delete_to_line_start(),
            A::DeleteWord => input.delete_word(),
            A::LineStart => input.home(),
            A::LineEnd => input.end(),
            A::Backspace => input.backspace(),
            A::Delete => input.delete(),
            A::Left => input.left(),
            A::Right => input.right(),
            A::CursorUp => {
                input.up();
            }
            A::CursorDown => {
                input.down();
            }
            _ => {}
        }
    }

    /// Pasted text (bracketed paste) goes into the input box as is, newlines kept.
    pub fn on_paste(&mut self, text: &str) {
        if matches!(self.phase, Phase::Failed(_)) {
            return;
        }
        self.show_help = false;
        self.history_pos = None;
        self.input.insert_str(text);
    }

    pub fn on_mouse(&mut self, m: MouseEvent) {
        match m.kind {
            MouseEventKind::ScrollUp => self.scroll_by(-3),
            MouseEventKind::ScrollDown => self.scroll_by(3),
            _ => {}
        }
    }

    fn page(&self) -> i64 {
        let (_, h) = crate::tui::ui::chat_geometry(self);
        (h as i64 - 2).max(1)
    }

    fn cancel(&mut self) -> Vec<Effect> {
        self.phase = Phase::Cancelling;
        self.status = Some("cancelling…".into());
        vec![Effect::Engine(crate::engine::events::Command::Cancel)]
    }

    fn select_turn(&mut self, dir: i64) {
        let turns: Vec<usize> = (0..self.items.len())
            .filter(|&i| matches!(self.items[i], Item::Turn(_)))
            .collect();
        if turns.is_empty() {
            return;
        }
        let cur = self
            .selected
            .and_then(|s| turns.iter().position(|&i| i == s))
            .unwrap_or(turns.len() - 1) as i64;
        let next = (cur + dir).clamp(0, turns.len() as i64 - 1) as usize;
        self.selected = Some(turns[next]);
    }

    fn toggle_reasoning(&mut self) {
        if let Some(i) = self.selected_turn()
            && let Item::Turn(t) = &mut self.items[i]
        {
            if t.reasoning.is_empty() {
                self.status = Some("this turn has no reasoning".into());
                return;
            }
            t.reasoning_open = Some(!t.reasoning_visible());
        }
    }

    fn copy_last_answer(&mut self) -> Vec<Effect> {
        let answer = self.items.iter().rev().find_map(|i| match i {
            Item::Turn(t) if !t.answer.is_empty() => Some(t.answer.clone()),
            _ => None,
        });
        match answer {
            Some(a) => {
                self.status = Some(format!("copied {} characters (OSC 52)", a.chars().count()));
                vec![Effect::CopyToClipboard(a)]
            }
            None => {
                self.status = Some("no answer to copy yet".into());
                Vec::new()
            }
        }
    }

    fn recall(&mut self, dir: i64) {
        if self.history.is_empty() {
            return;
        }
        let n = self.history.len() as i64;
        let pos = match self.history_pos {
            None if dir < 0 => n - 1,
            None => return,
            Some(p) => p as i64 + dir,
        };
        if pos >= n {
            self.history_pos = None;
            self.input.set("");
            return;
        }
        let pos = pos.clamp(0, n - 1) as usize;
        self.history_pos = Some(pos);
        let text = self.history[pos].clone();
        self.input.set(&text);
    }
}
