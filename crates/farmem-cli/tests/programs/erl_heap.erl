%% Erlang (BEAM) under `farmem run`: a map and an ETS table of N entries built, read at
%% random and every value checked, and a command run through a port (Erlang's helper
%% erl_child_setup closes every descriptor it did not open, then forks the command).
%% Prints "N entries verified" and the command's output.
%% Usage: erl -noshell -pa DIR -run erl_heap main N
-module(erl_heap).
-export([main/1]).

value(I) -> {I * 7, integer_to_list(I * 13)}.
row(I) -> lists:duplicate(I rem 40 + 1, $a + I rem 26).

main([Arg]) ->
    N = list_to_integer(Arg),
    M = maps:from_list([{I, value(I)} || I <- lists:seq(1, N)]),
    T = ets:new(rows, [set]),
    [ets:insert(T, {I, row(I)}) || I <- lists:seq(1, N)],
    check(M, T, N, 0, N),
    io:format("~p entries verified~n", [N]),
    io:format("~s", [os:cmd("echo port command ran")]),
    halt(0).

check(_, _, _, _, 0) -> ok;
check(M, T, N, X, Left) ->
    I = X rem N + 1,
    Want = value(I),
    case maps:get(I, M) of
        Want -> ok;
        Got -> io:format("entry ~p: ~p, want ~p~n", [I, Got, Want]), halt(1)
    end,
    WantRow = row(I),
    case ets:lookup(T, I) of
        [{I, WantRow}] -> ok;
        Other -> io:format("row ~p: ~p~n", [I, Other]), halt(1)
    end,
    check(M, T, N, (X * 1103515245 + 12345) rem 2147483648, Left - 1).
